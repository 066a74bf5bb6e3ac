// D12 grid sized for one batch (CPU): a correct row-per-block layer norm whose launch spec
// hard-codes 64 blocks; with 100 rows, rows 64..99 are never written.
// One row of layer norm: two passes in double, then the affine step.
static inline void ln_row(float* y, float* mean_out, float* rstd_out, const float* x, const float* w,
                          const float* b, int64_t n, float eps) {
  double s = 0.0;
  for (int64_t c = 0; c < n; ++c) s += x[c];
  const double mean = s / (double)n;
  double q = 0.0;
  for (int64_t c = 0; c < n; ++c) q += (x[c] - mean) * (x[c] - mean);
  const float rstd = (float)(1.0 / sqrt(q / (double)n + eps));
  const float mu = (float)mean;
  for (int64_t c = 0; c < n; ++c) y[c] = (x[c] - mu) * rstd * w[c] + b[c];
  *mean_out = mu;
  *rstd_out = rstd;
}

extern "C" void kc_layer_norm_rows(const kc_cpu_ctx* ctx, void* const* args) {
  float* y = KC_ARG(float*, args, 0);
  float* mean = KC_ARG(float*, args, 1);
  float* rstd = KC_ARG(float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const float* w = KC_ARG(const float*, args, 4);
  const float* b = KC_ARG(const float*, args, 5);
  const int64_t n = KC_ARG(int64_t, args, 6);
  const float eps = KC_ARG(float, args, 7);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) ln_row(y + r * n, mean + r, rstd + r, x + r * n, w, b, n, eps);
}
