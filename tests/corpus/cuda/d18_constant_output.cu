// D18 constant / degenerate output: a "softmax" that writes 1/n everywhere. Its error is small
// wherever the task's inputs barely vary along a row (a badly chosen test); any spread shows it.
extern "C" __global__ void kc_softmax_uniform(float* __restrict__ out, const float* __restrict__ x, long long n,
                                              long long total) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < total) out[i] = 1.0f / (float)n;
}
