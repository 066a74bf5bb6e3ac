// Honest (CPU): exact (erf) gelu over blocks of block[0] elements; NaN propagates.
extern "C" void kc_gelu_erf(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      out[i] = v * 0.5f * (1.0f + erff(v * 0.70710678118654752f));
    }
  }
}
