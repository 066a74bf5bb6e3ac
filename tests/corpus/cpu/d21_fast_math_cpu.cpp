// D21 fast-math side effects (CPU): relu compiled under fast-math. -ffinite-math-only lets the
// compiler fold `v != v` to false, so NaN inputs come out as 0 instead of NaN.
#pragma GCC optimize("fast-math")
extern "C" void kc_relu_fast(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      out[i] = (v > 0.0f || v != v) ? v : 0.0f;
    }
  }
}
