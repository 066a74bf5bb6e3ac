// D14 ignores strides (CPU): a softmax that always normalises contiguous rows of the last
// dimension and never looks at `dim`. With dim=0 on a 33x1000 tensor it normalises the wrong axis.
// Softmax of one row of n floats; exact max subtraction, double accumulation.
static inline void softmax_row(float* y, const float* x, int64_t n, int64_t stride) {
  float m = -INFINITY;
  for (int64_t c = 0; c < n; ++c) m = x[c * stride] > m ? x[c * stride] : m;
  double s = 0.0;
  for (int64_t c = 0; c < n; ++c) s += expf(x[c * stride] - m);
  for (int64_t c = 0; c < n; ++c) y[c * stride] = (float)(expf(x[c * stride] - m) / s);
}

extern "C" void kc_softmax_lastdim(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) softmax_row(out + r * n, x + r * n, n, 1);
}
