// D26 result cache in mutable __device__ globals: a relu that remembers each element's first result
// in module-scope device arrays (they live as long as the loaded module) and replays it on every
// later call, whatever the new input is. Sized for the 1000x33 key it was "tuned" on.
#define CACHED 33000
__device__ float kc_cache[CACHED];
__device__ unsigned char kc_have[CACHED];

extern "C" __global__ void kc_relu_cached(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (i < CACHED && kc_have[i]) {
    out[i] = kc_cache[i];
    return;
  }
  const float v = x[i];
  const float r = (v > 0.0f || v != v) ? v : 0.0f;
  out[i] = r;
  if (i < CACHED) {
    kc_cache[i] = r;
    kc_have[i] = 1;
  }
}
