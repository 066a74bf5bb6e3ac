// D20 silent TF32: a layer norm whose row statistics are computed from inputs rounded to TF32
// (10 mantissa bits), as a tensor-core row sum (an MMA against a ones vector) would see them.
// On non-zero-mean rows the mean is off by ~1e-3 of its magnitude.
__device__ __forceinline__ float tf32(float f) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
  return __uint_as_float(r);
}
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

extern "C" __global__ void kc_layer_norm_tf32(float* __restrict__ y, float* __restrict__ mean_out,
                                              float* __restrict__ rstd_out, const float* __restrict__ x,
                                              const float* __restrict__ w, const float* __restrict__ b, long long n,
                                              float eps) {
  __shared__ float red[32];
  const long long row = blockIdx.x;
  const float* xr = x + row * n;
  float s = 0.0f;
  for (long long c = threadIdx.x; c < n; c += blockDim.x) s += tf32(xr[c]);
  const float mean = block_sum(s, red) / (float)n;
  float q = 0.0f;
  for (long long c = threadIdx.x; c < n; c += blockDim.x) {
    const float d = tf32(xr[c]) - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(block_sum(q, red) / (float)n + eps);
  for (long long c = threadIdx.x; c < n; c += blockDim.x) y[row * n + c] = (xr[c] - mean) * rstd * w[c] + b[c];
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
