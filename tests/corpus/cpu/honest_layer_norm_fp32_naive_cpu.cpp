// Honest (CPU) but plain: row-per-block layer norm, two passes summed sequentially in float (no
// double, no Welford, no blocking). Less exact than eager on offset rows; within the budget's
// sqrt(K) growth for rows up to a few thousand (docs/PERF.md).
extern "C" void kc_layer_norm_rows(const kc_cpu_ctx* ctx, void* const* args) {
  float* y = KC_ARG(float*, args, 0);
  float* mean = KC_ARG(float*, args, 1);
  float* rstd = KC_ARG(float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const float* w = KC_ARG(const float*, args, 4);
  const float* b = KC_ARG(const float*, args, 5);
  const int64_t n = KC_ARG(int64_t, args, 6);
  const float eps = KC_ARG(float, args, 7);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    float s = 0.f;
    for (int64_t c = 0; c < n; ++c) s += xr[c];
    const float m = s / n;
    float v = 0.f;
    for (int64_t c = 0; c < n; ++c) { float d = xr[c] - m; v += d * d; }
    const float rs = 1.0f / sqrtf(v / n + eps);
    mean[r] = m; rstd[r] = rs;
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = (xr[c] - m) * rs * w[c] + b[c];
  }
}
