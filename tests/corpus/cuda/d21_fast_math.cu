// D21 fast-math side effects: silu through __expf and __fdividef. __fdividef returns 0 for
// divisors above 2^126 (x < -87.3 gives -0 instead of ~1e-37) and __expf's error grows with |x|;
// both flush denormals.
extern "C" __global__ void kc_silu_fast(float* __restrict__ out, const float* __restrict__ x, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = x[i];
    out[i] = __fdividef(v, 1.0f + __expf(-v));
  }
}
