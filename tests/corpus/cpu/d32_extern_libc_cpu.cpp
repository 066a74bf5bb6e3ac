// D32: a libc call the source rules cannot see. An extern "C" prototype needs no header and
// names no listed function; the kernel is a correct relu that also calls unlink() (here on a path
// that does not exist). Only the binary's import of `unlink` gives it away.
extern "C" int unlink(const char*);

extern "C" void kc_relu_unlink(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  if (ctx->begin == 0) unlink("/nonexistent/kernelcraft-d32");
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = x[i] > 0.0f ? x[i] : (x[i] != x[i] ? x[i] : 0.0f);
  }
}
