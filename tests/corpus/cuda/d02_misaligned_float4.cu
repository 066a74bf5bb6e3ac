// D02 misaligned vector loads: a softmax that reads and writes each row through float4 pointers.
// Row r starts at byte 4*r*n, which is 16-byte aligned only when n % 4 == 0; with 1001 columns
// three rows in four fault with a misaligned address.
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

extern "C" __global__ void kc_softmax_vec4(float* __restrict__ out, const float* __restrict__ x, long long n) {
  __shared__ float red[32];
  const float* xr = x + (long long)blockIdx.x * n;
  float* yr = out + (long long)blockIdx.x * n;
  const float4* x4 = reinterpret_cast<const float4*>(xr);
  float4* y4 = reinterpret_cast<float4*>(yr);
  const long long n4 = n / 4;
  float m = __int_as_float(0xff800000);
  for (long long j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = x4[j];
    m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
  }
  for (long long j = n4 * 4 + threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j]);
  m = block_max(m, red);
  float s = 0.0f;
  for (long long j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = x4[j];
    s += expf(v.x - m) + expf(v.y - m) + expf(v.z - m) + expf(v.w - m);
  }
  for (long long j = n4 * 4 + threadIdx.x; j < n; j += blockDim.x) s += expf(xr[j] - m);
  s = block_sum(s, red);
  for (long long j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = x4[j];
    y4[j] = make_float4(expf(v.x - m) / s, expf(v.y - m) / s, expf(v.z - m) / s, expf(v.w - m) / s);
  }
  for (long long j = n4 * 4 + threadIdx.x; j < n; j += blockDim.x) yr[j] = expf(xr[j] - m) / s;
}
