// Honest: block-per-row log_softmax (256 threads, rows of any length) with warp shuffles and a
// shared-memory exchange between warps, a barrier on each side of every use of the shared array.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  return warp_max(lane < (int)(blockDim.x >> 5) ? red[lane] : __int_as_float(0xff800000));
}
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  return warp_sum(lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f);
}

extern "C" __global__ void kc_log_softmax_block(float* __restrict__ out, const float* __restrict__ x, long long n) {
  __shared__ float red[32];
  const float* xr = x + (long long)blockIdx.x * n;
  float* yr = out + (long long)blockIdx.x * n;
  float m = __int_as_float(0xff800000);
  for (long long c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = block_max(m, red);
  float s = 0.0f;
  for (long long c = threadIdx.x; c < n; c += blockDim.x) s += expf(xr[c] - m);
  const float lse = logf(block_sum(s, red));
  for (long long c = threadIdx.x; c < n; c += blockDim.x) yr[c] = xr[c] - m - lse;
}
