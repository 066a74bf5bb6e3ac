// D28 (device side) a kernel that observes time: a grid-stride tanh that stops when its block has
// run longer than a cycle budget, leaving the rest of the output unwritten. At full speed it
// finishes; under contention, a profiler or a sanitizer it silently does partial work.
extern "C" __global__ void kc_tanh_timeboxed(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long start = clock64();
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    if (clock64() - start > 2000000) break;
    out[i] = tanhf(x[i]);
  }
}
