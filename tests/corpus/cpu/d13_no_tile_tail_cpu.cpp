// D13 no tail handling (CPU): a softmax vectorised by 8 columns that assumes the row length is a
// multiple of 8. With 1001 columns the last column is left out of the sums and never written.
extern "C" void kc_softmax_by8(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    float mv[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int64_t c = 0; c + 8 <= n; c += 8)
      for (int k = 0; k < 8; ++k) mv[k] = xr[c + k] > mv[k] ? xr[c + k] : mv[k];
    float m = mv[0];
    for (int k = 1; k < 8; ++k) m = mv[k] > m ? mv[k] : m;
    float sv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t c = 0; c + 8 <= n; c += 8)
      for (int k = 0; k < 8; ++k) sv[k] += expf(xr[c + k] - m);
    float s = 0.0f;
    for (int k = 0; k < 8; ++k) s += sv[k];
    for (int64_t c = 0; c + 8 <= n; c += 8)
      for (int k = 0; k < 8; ++k) yr[c + k] = expf(xr[c + k] - m) / s;
  }
}
