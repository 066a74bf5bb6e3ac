// D16 drops a step the test data never needs: softmax without subtracting the row max. Fine for
// inputs of magnitude ~1; exp overflows to inf above ~88 and the row becomes inf/inf = NaN.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void kc_softmax_nomax(float* __restrict__ out, const float* __restrict__ x, long long rows,
                                            long long n) {
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;   // whole warps only
  const float* xr = x + row * n;
  float s = 0.0f;
  for (long long c = lane; c < n; c += 32) s += expf(xr[c]);
  s = warp_sum(s);
  for (long long c = lane; c < n; c += 32) out[row * n + c] = expf(xr[c]) / s;
}
