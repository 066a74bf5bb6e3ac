// D09 writes into the inputs: a relu that also stores its result back into `self` ("in place, to
// save a pass later"). The output is right; the caller's input is not what it was.
extern "C" __global__ void kc_relu_clobber(float* __restrict__ out, float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    const float r = (v > 0.0f || v != v) ? v : 0.0f;
    x[i] = r;
    out[i] = r;
  }
}
