// Honest (CPU): log_softmax backward, grad - exp(y) * sum(grad) per row (sum in double).
extern "C" void kc_log_softmax_bwd(const kc_cpu_ctx* ctx, void* const* args) {
  float* gi = KC_ARG(float*, args, 0);
  const float* go = KC_ARG(const float*, args, 1);
  const float* y = KC_ARG(const float*, args, 2);
  const int64_t n = KC_ARG(int64_t, args, 3);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    double s = 0.0;
    for (int64_t c = 0; c < n; ++c) s += go[r * n + c];
    const float sf = (float)s;
    for (int64_t c = 0; c < n; ++c) gi[r * n + c] = go[r * n + c] - expf(y[r * n + c]) * sf;
  }
}
