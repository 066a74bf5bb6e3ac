// Honest: layer norm with one warp per row (8 rows per 256-thread block). The row mean and the
// centred variance are fp32 sums reduced by shuffles, so their summation order differs from
// eager's. The mean of a row of values near 1 that nearly cancel is close to zero: it cannot be
// computed to its own relative accuracy in any order, and the error model must not ask for that.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void kc_ln_warp(float* __restrict__ y, float* __restrict__ mean_out,
                                      float* __restrict__ rstd_out, const float* __restrict__ x,
                                      const float* __restrict__ w, const float* __restrict__ b,
                                      long long rows, long long n, float eps) {
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;            // whole warps leave together: every shuffle has 32 lanes
  const float* xr = x + row * n;
  float s = 0.0f;
  for (long long c = lane; c < n; c += 32) s += xr[c];
  const float mean = warp_sum(s) / (float)n;
  float q = 0.0f;
  for (long long c = lane; c < n; c += 32) {
    const float d = xr[c] - mean;
    q += d * d;
  }
  const float rstd = rsqrtf(warp_sum(q) / (float)n + eps);
  for (long long c = lane; c < n; c += 32) y[row * n + c] = (xr[c] - mean) * rstd * w[c] + b[c];
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
