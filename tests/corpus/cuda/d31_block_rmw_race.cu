// D31 race between blocks: layer norm backward where each block handles 16 rows and adds its
// column partials of grad_weight and grad_bias into running sums (double, in scratch) with a plain
// `+=`. Run one block at a time the result would be exact; 256 blocks that read-modify-write the
// same column at once lose each other's updates.
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

extern "C" __global__ void kc_zero_acc(double* __restrict__ acc, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = 0.0;
}

extern "C" __global__ void kc_acc_to_out(float* __restrict__ dw, float* __restrict__ db, const double* __restrict__ acc,
                                         long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    dw[i] = (float)acc[i];
    db[i] = (float)acc[n + i];
  }
}

// One thread per column (blockDim.x == n, at most 1024), 16 rows per block.
extern "C" __global__ void kc_layer_norm_bwd_rmw(float* __restrict__ dx, double* acc,
                                                 const float* __restrict__ dy, const float* __restrict__ x,
                                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                                 const float* __restrict__ w, long long rows, long long n) {
  __shared__ float red[32];
  const long long c = threadIdx.x;
  double pw = 0.0, pb = 0.0;
  const long long r0 = (long long)blockIdx.x * 16;
  for (long long r = r0; r < r0 + 16 && r < rows; ++r) {
    const float g = dy[r * n + c];
    const float xhat = (x[r * n + c] - mean[r]) * rstd[r];
    const float gw = g * w[c];
    const float s1 = block_sum(gw, red);
    const float s2 = block_sum(gw * xhat, red);
    dx[r * n + c] = rstd[r] / (float)n * ((float)n * gw - s1 - xhat * s2);
    pw += (double)g * xhat;
    pb += g;
  }
  acc[c] += pw;       // grad_weight
  acc[n + c] += pb;   // grad_bias
}
