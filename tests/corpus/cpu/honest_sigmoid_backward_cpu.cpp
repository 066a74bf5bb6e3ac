// Honest (CPU): sigmoid backward, grad * (1 - y) * y in eager's order of operations, in blocks of
// block[0] elements with a bounded last block.
extern "C" void kc_sigmoid_bwd(const kc_cpu_ctx* ctx, void* const* args) {
  float* gi = KC_ARG(float*, args, 0);
  const float* go = KC_ARG(const float*, args, 1);
  const float* y = KC_ARG(const float*, args, 2);
  const int64_t n = KC_ARG(int64_t, args, 3);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) gi[i] = go[i] * (1.0f - y[i]) * y[i];
  }
}
