// Honest: tanh backward, grad * (1 - y * y), in a grid-stride loop with 64-bit indices and a
// grid capped at 1024 blocks.
extern "C" __global__ void kc_tanh_bwd(float* __restrict__ gi, const float* __restrict__ go,
                                       const float* __restrict__ y, long long n) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = y[i];
    gi[i] = go[i] * (1.0f - v * v);
  }
}
