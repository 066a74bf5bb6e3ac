// D04 barrier and warp-sync misuse in divergent code: a layer norm with one thread per column and a
// block of 1024 threads. Threads past the row's end (1000..1023 for 1000 columns) return early, and
// the rest then meet at __syncthreads() and at full-mask shuffles that name the exited lanes.
// Right only when the row length is a multiple of the block size.
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

extern "C" __global__ void kc_layer_norm_exit_early(float* __restrict__ y, float* __restrict__ mean_out,
                                                    float* __restrict__ rstd_out, const float* __restrict__ x,
                                                    const float* __restrict__ w, const float* __restrict__ b,
                                                    long long n, float eps) {
  __shared__ float red[32];
  const int c = threadIdx.x;
  const long long row = blockIdx.x;
  if (c >= n) return;   // the rest of the block still expects these threads at every barrier
  const float v = x[row * n + c];
  const float mean = block_sum(v, red) / (float)n;
  const float d = v - mean;
  const float var = block_sum(d * d, red) / (float)n;
  const float rstd = rsqrtf(var + eps);
  y[row * n + c] = d * rstd * w[c] + b[c];
  if (c == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}
