// A trivial CPU kernel for the CLI test: out0 = self, one block of block[0] elements at a time.
extern "C" void kc_copy_f32(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t i = b * ctx->block[0]; i < n && i < (b + 1) * ctx->block[0]; ++i) out[i] = x[i];
}
