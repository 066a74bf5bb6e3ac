// D19 silent precision downgrade (CPU): a log_softmax that accumulates the sum of exponentials in
// _Float16 (11 significant bits).
extern "C" void kc_log_softmax_f16(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = xr[c] > m ? xr[c] : m;
    _Float16 s = 0;
    for (int64_t c = 0; c < n; ++c) s += (_Float16)expf(xr[c] - m);
    const float lse = logf((float)s);
    for (int64_t c = 0; c < n; ++c) out[r * n + c] = xr[c] - m - lse;
  }
}
