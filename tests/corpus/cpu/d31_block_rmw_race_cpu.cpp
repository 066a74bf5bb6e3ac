// D31 race between blocks (CPU): layer norm backward where every block (16 rows) adds into
// grad_weight and grad_bias with a plain `+=`. Blocks run in parallel on the runtime's threads, so
// concurrent read-modify-writes of a column lose updates (with one thread it happens to be right).
extern "C" void kc_zero2(const kc_cpu_ctx* ctx, void* const* args) {
  float* a = KC_ARG(float*, args, 0);
  float* b = KC_ARG(float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  if (ctx->begin == 0)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] = 0.0f;
}

extern "C" void kc_layer_norm_bwd_rmw(const kc_cpu_ctx* ctx, void* const* args) {
  float* dx = KC_ARG(float*, args, 0);
  float* dw = KC_ARG(float*, args, 1);
  float* db = KC_ARG(float*, args, 2);
  const float* dy = KC_ARG(const float*, args, 3);
  const float* x = KC_ARG(const float*, args, 4);
  const float* mean = KC_ARG(const float*, args, 5);
  const float* rstd = KC_ARG(const float*, args, 6);
  const float* w = KC_ARG(const float*, args, 7);
  const int64_t rows = KC_ARG(int64_t, args, 8);
  const int64_t n = KC_ARG(int64_t, args, 9);
  for (int64_t blk = ctx->begin; blk < ctx->end; ++blk) {
    for (int64_t r = blk * 16; r < blk * 16 + 16 && r < rows; ++r) {
      const float mu = mean[r], rs = rstd[r];
      double s1 = 0.0, s2 = 0.0;
      for (int64_t c = 0; c < n; ++c) {
        const float gw = dy[r * n + c] * w[c];
        s1 += gw;
        s2 += gw * (x[r * n + c] - mu) * rs;
      }
      for (int64_t c = 0; c < n; ++c) {
        const float xhat = (x[r * n + c] - mu) * rs;
        dx[r * n + c] = rs / (float)n * ((float)n * dy[r * n + c] * w[c] - (float)s1 - xhat * (float)s2);
        dw[c] += dy[r * n + c] * xhat;
        db[c] += dy[r * n + c];
      }
    }
  }
}
