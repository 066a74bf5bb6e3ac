// D27 state drift: a gelu with a __device__ call counter. The first 50 calls are exact; after that
// it switches to a cheaper (wrong) approximation, x * sigmoid(1.702 x). Checks that stop after a few
// calls never see it; a recheck after the timed calls does.
__device__ unsigned int kc_calls;

extern "C" __global__ void kc_gelu_drift(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned calls = *(volatile unsigned*)&kc_calls;
  if (i < n) {
    const float v = x[i];
    out[i] = calls < 50 ? v * 0.5f * (1.0f + erff(v * 0.70710678118654752f)) : v / (1.0f + expf(-1.702f * v));
  }
  if (i == 0) atomicAdd(&kc_calls, 1u);
}
