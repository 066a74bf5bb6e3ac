// D07 unchecked launch failure: a correct tanh whose launch spec asks for 2048 threads per block,
// more than any NVIDIA GPU allows (1024). cuLaunchKernel fails and the kernel never runs; a host
// that does not check the launch returns the untouched output.
extern "C" __global__ void kc_tanh_bigblock(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tanhf(x[i]);
}
