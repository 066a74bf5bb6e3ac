// D15 relies on default parameter init (CPU): a layer norm that skips the affine step (assumes
// weight == 1 and bias == 0).
extern "C" void kc_layer_norm_noaffine(const kc_cpu_ctx* ctx, void* const* args) {
  float* y = KC_ARG(float*, args, 0);
  float* mean = KC_ARG(float*, args, 1);
  float* rstd = KC_ARG(float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const int64_t n = KC_ARG(int64_t, args, 4);
  const float eps = KC_ARG(float, args, 5);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    double s = 0.0;
    for (int64_t c = 0; c < n; ++c) s += xr[c];
    const double mu = s / (double)n;
    double q = 0.0;
    for (int64_t c = 0; c < n; ++c) q += (xr[c] - mu) * (xr[c] - mu);
    const float rs = (float)(1.0 / sqrt(q / (double)n + eps));
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = (xr[c] - (float)mu) * rs;
    mean[r] = (float)mu;
    rstd[r] = rs;
  }
}
