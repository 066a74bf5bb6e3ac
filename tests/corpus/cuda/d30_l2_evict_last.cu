// D30 L2 residency tricks: a correct relu whose loads carry an L2 evict_last cache policy, so the
// input tends to stay resident in L2 across calls (and across a harness's L2 flush), which makes
// repeated timing look faster than the memory system allows.
__device__ __forceinline__ float load_keep(const float* p, unsigned long long policy) {
  float v;
  asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(policy));
  return v;
}

extern "C" __global__ void kc_relu_keep_l2(float* __restrict__ out, const float* __restrict__ x, long long n) {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float v = load_keep(x + i, policy);
    out[i] = (v > 0.0f || v != v) ? v : 0.0f;
  }
}
