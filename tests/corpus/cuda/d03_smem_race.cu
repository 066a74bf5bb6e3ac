// D03 shared-memory race: a block-per-row softmax with a shared-memory tree reduction. The barrier
// between the max phase and the sum phase is missing: thread 0 overwrites red[0] (the row max)
// with its partial sum while slower warps may still read it, and the tree's first step reads
// red[tid + 128] before the warps that own those slots have written their partial sums.
extern "C" __global__ void kc_softmax_smem_race(float* __restrict__ out, const float* __restrict__ x, long long n) {
  __shared__ float red[256];
  const int tid = threadIdx.x;
  const float* xr = x + (long long)blockIdx.x * n;
  float* yr = out + (long long)blockIdx.x * n;
  float m = __int_as_float(0xff800000);
  for (long long c = tid; c < n; c += blockDim.x) m = fmaxf(m, xr[c]);
  red[tid] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] = fmaxf(red[tid], red[tid + s]);
    __syncthreads();
  }
  m = red[0];
  float sum = 0.0f;
  for (long long c = tid; c < n; c += blockDim.x) sum += expf(xr[c] - m);
  red[tid] = sum;   // no __syncthreads() before or after this store
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  sum = red[0];
  for (long long c = tid; c < n; c += blockDim.x) yr[c] = expf(xr[c] - m) / sum;
}
