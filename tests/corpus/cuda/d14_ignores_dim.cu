// D14 ignores strides: a softmax written for the last dimension (stride 1) that never looks at
// `dim` or at the reduced dimension's stride. With dim=0 on a 33x1000 tensor it normalises the
// wrong axis: right shape, right values for another call, wrong for this one.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void kc_softmax_lastdim(float* __restrict__ out, const float* __restrict__ x, long long rows,
                                              long long n) {
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;   // whole warps only
  const float* xr = x + row * n;
  float m = __int_as_float(0xff800000);
  for (long long c = lane; c < n; c += 32) m = fmaxf(m, xr[c]);
  m = warp_max(m);
  float s = 0.0f;
  for (long long c = lane; c < n; c += 32) s += expf(xr[c] - m);
  s = warp_sum(s);
  for (long long c = lane; c < n; c += 32) out[row * n + c] = expf(xr[c] - m) / s;
}
