// Honest, not bitwise deterministic: layer norm over long rows split across several blocks per row.
// Row sums go through float atomicAdd into scratch, so their summation order varies from run to
// run and the results differ in the last bits, within what fp32 allows. Scratch is not cleared by
// the runtime, so the first launch zeroes it. Each block sums its part in double; a coarse mean
// (pass 0) is refined by a second sum of x - coarse (pass 1), which keeps the float totals small
// on non-zero-mean rows; the variance comes from centred squares (pass 2).
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ double block_sum(double v, double* red) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  return warp_sum(lane < (int)(blockDim.x >> 5) ? red[lane] : 0.0);
}

// Per row, stats[3*row + k]: k = 0 sum of x, 1 sum of (x - coarse), 2 sum of (x - mean)^2.
__device__ __forceinline__ float coarse_mean(const float* stats, long long row, long long n) {
  return stats[3 * row] / (float)n;
}
__device__ __forceinline__ float row_mean(const float* stats, long long row, long long n) {
  return coarse_mean(stats, row, n) + stats[3 * row + 1] / (float)n;
}

extern "C" __global__ void kc_ln_zero(float* __restrict__ stats, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) stats[i] = 0.0f;
}

// grid (ceil(n / 1024), rows), 256 threads, 4 columns per thread; pass 0, 1 or 2 as above.
extern "C" __global__ void kc_ln_pass(float* stats, const float* __restrict__ x, long long n, int pass) {
  __shared__ double red[32];
  const long long row = blockIdx.y, c0 = (long long)blockIdx.x * 1024;
  const float shift = pass == 0 ? 0.0f : pass == 1 ? coarse_mean(stats, row, n) : row_mean(stats, row, n);
  double s = 0.0;
  for (int k = 0; k < 4; ++k) {
    const long long c = c0 + k * 256 + threadIdx.x;
    if (c < n) {
      const double d = (double)x[row * n + c] - shift;
      s += pass == 2 ? d * d : d;
    }
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) atomicAdd(&stats[3 * row + pass], (float)s);
}

extern "C" __global__ void kc_ln_apply(float* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                       const float* __restrict__ stats, const float* __restrict__ x,
                                       const float* __restrict__ w, const float* __restrict__ b, long long n, float eps) {
  const long long row = blockIdx.y, c0 = (long long)blockIdx.x * 1024;
  const float mean = row_mean(stats, row, n);
  const float rstd = rsqrtf(stats[3 * row + 2] / (float)n + eps);
  for (int k = 0; k < 4; ++k) {
    const long long c = c0 + k * 256 + threadIdx.x;
    if (c < n) y[row * n + c] = (x[row * n + c] - mean) * rstd * w[c] + b[c];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
