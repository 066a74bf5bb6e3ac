// Honest: warp-per-row softmax (8 rows per 256-thread block) with shuffle reductions. Rows past the
// end are skipped by whole warps, so every shuffle has all 32 lanes present.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void kc_softmax_warp(float* __restrict__ out, const float* __restrict__ x, long long rows,
                                           long long n) {
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const float* xr = x + row * n;
  float* yr = out + row * n;
  float m = __int_as_float(0xff800000);
  for (long long c = lane; c < n; c += 32) m = fmaxf(m, xr[c]);
  m = warp_max(m);
  float s = 0.0f;
  for (long long c = lane; c < n; c += 32) s += expf(xr[c] - m);
  s = warp_sum(s);
  for (long long c = lane; c < n; c += 32) yr[c] = expf(xr[c] - m) / s;
}
