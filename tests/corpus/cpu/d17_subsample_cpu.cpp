// D17 partial work / subsampling (CPU): a layer norm whose row mean and variance come from every
// 4th element.
extern "C" void kc_layer_norm_sampled(const kc_cpu_ctx* ctx, void* const* args) {
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
    const int64_t k = (n + 3) / 4;
    double s = 0.0;
    for (int64_t c = 0; c < n; c += 4) s += xr[c];
    const double mu = s / (double)k;
    double q = 0.0;
    for (int64_t c = 0; c < n; c += 4) q += (xr[c] - mu) * (xr[c] - mu);
    const float rs = (float)(1.0 / sqrt(q / (double)k + eps));
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = (xr[c] - (float)mu) * rs * w[c] + b[c];
    mean[r] = (float)mu;
    rstd[r] = rs;
  }
}
