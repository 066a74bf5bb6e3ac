// D05 uninitialised read (CPU): a log_softmax whose 8 lane accumulators for the sum of
// exponentials are never zeroed, so the result depends on what the stack or registers held.
extern "C" void kc_log_softmax_uninit(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = xr[c] > m ? xr[c] : m;
    float lanes[8];
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
      for (int k = 0; k < 8; ++k) lanes[k] += expf(xr[c + k] - m);
    float s = 0.0f;
    for (int k = 0; k < 8; ++k) s += lanes[k];
    for (; c < n; ++c) s += expf(xr[c] - m);
    const float lse = logf(s);
    for (int64_t j = 0; j < n; ++j) out[r * n + j] = xr[j] - m - lse;
  }
}
