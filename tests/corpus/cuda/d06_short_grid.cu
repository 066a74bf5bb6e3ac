// D06 output not fully written: a correct, guarded sigmoid launched on a grid of numel/256 blocks
// (rounded down). For 1000x33 the last 232 elements are never written; an output allocated with
// `empty` keeps whatever was there, often the previous call's correct values.
extern "C" __global__ void kc_sigmoid_short(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i]));
}
