// D11 hard-coded shape (CPU): a softmax written for rows of 1024. Only the total element count is
// checked, so with 1000 columns every row after the first straddles two real rows.
#define COLS 1024
extern "C" void kc_softmax_1024(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t total = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const int64_t base = r * COLS;
    const int64_t n = base + COLS <= total ? COLS : (base < total ? total - base : 0);
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) m = x[base + c] > m ? x[base + c] : m;
    double s = 0.0;
    for (int64_t c = 0; c < n; ++c) s += expf(x[base + c] - m);
    for (int64_t c = 0; c < n; ++c) out[base + c] = (float)(expf(x[base + c] - m) / s);
  }
}
