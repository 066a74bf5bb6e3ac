// Honest sigmoid through tanh: 0.5 tanh(x/2) + 0.5. It loses relative precision where the output
// is tiny (it underflows to 0 where eager gives a denormal); accurate to an ulp of 1.0, not wrong.
extern "C" void kc_sigmoid_tanh(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = 0.5f * tanhf(0.5f * x[i]) + 0.5f;
  }
}
