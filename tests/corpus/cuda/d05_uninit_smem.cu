// D05 uninitialised shared-memory read: a log_softmax with one thread per column and a tree
// reduction over all 1024 slots of the block. Only the first n slots are written (1000 columns),
// so the tree folds in whatever the previous kernel on that SM left in slots n..1023.
extern "C" __global__ void kc_log_softmax_uninit(float* __restrict__ out, const float* __restrict__ x, long long n) {
  __shared__ float red[1024];
  const int tid = threadIdx.x;
  const float* xr = x + (long long)blockIdx.x * n;
  float* yr = out + (long long)blockIdx.x * n;
  const float v = tid < n ? xr[tid] : 0.0f;
  if (tid < n) red[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
    __syncthreads();
  }
  const float m = red[0];
  __syncthreads();
  if (tid < n) red[tid] = expf(v - m);
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  const float lse = logf(red[0]);
  if (tid < n) yr[tid] = v - m - lse;
}
