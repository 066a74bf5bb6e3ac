// D18 constant / degenerate output (CPU): a "softmax" that writes 1/n everywhere.
extern "C" void kc_softmax_uniform(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r)
    for (int64_t c = 0; c < n; ++c) out[r * n + c] = 1.0f / (float)n;
}
