// Honest (CPU): row-per-block softmax with max subtraction; the sum of exponentials in double.
// NaN in a row makes the row NaN (as eager), +inf makes it NaN (inf - inf), -inf entries give 0.
extern "C" void kc_softmax_rows(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = xr[c] > m ? xr[c] : m;
    double s = 0.0;
    for (int64_t c = 0; c < n; ++c) s += expf(xr[c] - m);
    const float sf = (float)s;
    for (int64_t c = 0; c < n; ++c) out[r * n + c] = expf(xr[c] - m) / sf;
  }
}
