// A CUDA relu kernel for a contiguous float tensor: one thread per element, NaN propagates.
extern "C" __global__ void kc_relu_f32(float* __restrict__ out, const float* __restrict__ x, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    out[i] = (v > 0.0f || v != v) ? v : 0.0f;
  }
}
