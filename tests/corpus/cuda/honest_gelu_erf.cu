// Honest: exact (erf) gelu, one thread per element, 64-bit index, NaN propagates.
extern "C" __global__ void kc_gelu_erf(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    out[i] = v * 0.5f * (1.0f + erff(v * 0.70710678118654752f));
  }
}
