// Honest relu written the common way: fmaxf(x, 0) (returns 0 for NaN; torch.relu propagates NaN:
// a convention, not a defect, and the verifier must not reject it).
extern "C" void kc_relu_fmax(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = fmaxf(x[i], 0.0f);
  }
}
