// D27 state drift (CPU): a gelu with a call counter in a function-local static. Exact for the
// first 50 calls, then a cheaper wrong approximation, x * sigmoid(1.702 x).
extern "C" void kc_gelu_drift(const kc_cpu_ctx* ctx, void* const* args) {
  static unsigned calls = 0;
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const unsigned seen = __atomic_load_n(&calls, __ATOMIC_RELAXED);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      out[i] = seen < 50 ? v * 0.5f * (1.0f + erff(v * 0.70710678118654752f)) : v / (1.0f + expf(-1.702f * v));
    }
  }
  if (ctx->begin == 0) __atomic_fetch_add(&calls, 1u, __ATOMIC_RELAXED);
}
