// D31 race between blocks (CPU): layer norm backward where every block (16 rows) reads the running
// grad_weight / grad_bias sums (double, in scratch), adds its rows and writes them back, with no
// atomics or ownership. Run serially the result is exact; when the runtime's threads run blocks at
// the same time, a block overwrites the contributions another made in between.
extern "C" void kc_zero_acc(const kc_cpu_ctx* ctx, void* const* args) {
  double* acc = KC_ARG(double*, args, 0);
  const int64_t n = KC_ARG(int64_t, args, 1);
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    if (b == 0)
      for (int64_t i = 0; i < 2 * n; ++i) acc[i] = 0.0;
}

extern "C" void kc_layer_norm_bwd_rmw(const kc_cpu_ctx* ctx, void* const* args) {
  float* dx = KC_ARG(float*, args, 0);
  double* acc = KC_ARG(double*, args, 1);   // [0, n): grad_weight, [n, 2n): grad_bias
  const float* dy = KC_ARG(const float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const float* mean = KC_ARG(const float*, args, 4);
  const float* rstd = KC_ARG(const float*, args, 5);
  const float* w = KC_ARG(const float*, args, 6);
  const int64_t rows = KC_ARG(int64_t, args, 7);
  const int64_t n = KC_ARG(int64_t, args, 8);
  double pw[1024], pb[1024];
  if (n > 1024) return;
  for (int64_t blk = ctx->begin; blk < ctx->end; ++blk) {
    for (int64_t c = 0; c < n; ++c) {
      pw[c] = acc[c];
      pb[c] = acc[n + c];
    }
    for (int64_t r = blk * 16; r < blk * 16 + 16 && r < rows; ++r) {
      const float mu = mean[r], rs = rstd[r];
      double s1 = 0.0, s2 = 0.0;
      for (int64_t c = 0; c < n; ++c) {
        const float gw = dy[r * n + c] * w[c];
        s1 += gw;
        s2 += (double)gw * ((x[r * n + c] - mu) * rs);
      }
      const float k = rs / (float)n, s1f = (float)s1, s2f = (float)s2;
      for (int64_t c = 0; c < n; ++c) {
        const float xhat = (x[r * n + c] - mu) * rs;
        dx[r * n + c] = k * ((float)n * dy[r * n + c] * w[c] - s1f - xhat * s2f);
        pw[c] += (double)dy[r * n + c] * xhat;
        pb[c] += dy[r * n + c];
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      acc[c] = pw[c];
      acc[n + c] = pb[c];
    }
  }
}

extern "C" void kc_acc_to_out(const kc_cpu_ctx* ctx, void* const* args) {
  float* dw = KC_ARG(float*, args, 0);
  float* db = KC_ARG(float*, args, 1);
  const double* acc = KC_ARG(const double*, args, 2);
  const int64_t n = KC_ARG(int64_t, args, 3);
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    if (b == 0)
      for (int64_t c = 0; c < n; ++c) {
        dw[c] = (float)acc[c];
        db[c] = (float)acc[n + c];
      }
}
