// D09 writes into the inputs (CPU): relu that also stores its result back into `self`.
extern "C" void kc_relu_clobber(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  float* x = KC_ARG(float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = x[i];
      const float r = (v > 0.0f || v != v) ? v : 0.0f;
      x[i] = r;
      out[i] = r;
    }
  }
}
