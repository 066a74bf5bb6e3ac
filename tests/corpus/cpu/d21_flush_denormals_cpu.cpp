// D21 without a fast-math flag: flushes denormal inputs to zero by hand (what FTZ/DAZ would do),
// so relu(1e-40) is 0 instead of 1e-40.
extern "C" void kc_relu_fmax(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) { float v = x[i]; if (fabsf(v) < 1.17549435e-38f) v = 0.0f; out[i] = fmaxf(v, 0.0f); }
  }
}
