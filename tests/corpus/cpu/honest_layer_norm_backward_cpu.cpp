// Honest (CPU): layer norm backward (output_mask all true) in two launches: grad_input with one
// block per row; grad_weight and grad_bias with one block per 64-column strip, each summing over
// all rows in order (no block writes another's columns, so the result is deterministic).
extern "C" void kc_lnb_dx(const kc_cpu_ctx* ctx, void* const* args) {
  float* dx = KC_ARG(float*, args, 0);
  const float* dy = KC_ARG(const float*, args, 1);
  const float* x = KC_ARG(const float*, args, 2);
  const float* mean = KC_ARG(const float*, args, 3);
  const float* rstd = KC_ARG(const float*, args, 4);
  const float* w = KC_ARG(const float*, args, 5);
  const int64_t n = KC_ARG(int64_t, args, 6);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float mu = mean[r], rs = rstd[r];
    const float* dyr = dy + r * n;
    const float* xr = x + r * n;
    double s1 = 0.0, s2 = 0.0;
    for (int64_t c = 0; c < n; ++c) {
      const float gw = dyr[c] * w[c];
      s1 += gw;
      s2 += (double)gw * ((xr[c] - mu) * rs);
    }
    const float k = rs / (float)n, s1f = (float)s1, s2f = (float)s2;
    for (int64_t c = 0; c < n; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      dx[r * n + c] = k * ((float)n * dyr[c] * w[c] - s1f - xhat * s2f);
    }
  }
}

extern "C" void kc_lnb_dwdb(const kc_cpu_ctx* ctx, void* const* args) {
  float* dw = KC_ARG(float*, args, 0);
  float* db = KC_ARG(float*, args, 1);
  const float* dy = KC_ARG(const float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const float* mean = KC_ARG(const float*, args, 4);
  const float* rstd = KC_ARG(const float*, args, 5);
  const int64_t rows = KC_ARG(int64_t, args, 6);
  const int64_t n = KC_ARG(int64_t, args, 7);
  const int64_t strip = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * strip, hi = lo + strip < n ? lo + strip : n;
    for (int64_t c = lo; c < hi; ++c) {
      double sw = 0.0, sb = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        const float g = dy[r * n + c];
        sw += (double)g * ((x[r * n + c] - mean[r]) * rstd[r]);
        sb += g;
      }
      dw[c] = (float)sw;
      db[c] = (float)sb;
    }
  }
}
