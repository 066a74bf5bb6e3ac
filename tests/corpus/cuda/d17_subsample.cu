// D17 partial work / subsampling: a layer norm that estimates each row's mean and variance from
// every 4th element. Close on zero-mean, unit-variance data with many columns; far outside an
// fp64-based error budget otherwise.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  return warp_sum(lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0f);
}

extern "C" __global__ void kc_layer_norm_sampled(float* __restrict__ y, float* __restrict__ mean_out,
                                                 float* __restrict__ rstd_out, const float* __restrict__ x,
                                                 const float* __restrict__ w, const float* __restrict__ b, long long n,
                                                 float eps) {
  __shared__ float red[32];
  const long long row = blockIdx.x;
  const float* xr = x + row * n;
  const long long k = (n + 3) / 4;   // sampled elements
  float s = 0.0f;
  for (long long c = threadIdx.x * 4; c < n; c += blockDim.x * 4) s += xr[c];
  const float mean = block_sum(s, red) / (float)k;
  float q = 0.0f;
  for (long long c = threadIdx.x * 4; c < n; c += blockDim.x * 4) {
    const float d = xr[c] - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(block_sum(q, red) / (float)k + eps);
  for (long long c = threadIdx.x; c < n; c += blockDim.x) y[row * n + c] = (xr[c] - mean) * rstd * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
