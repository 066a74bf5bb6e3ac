// D32: code that runs when the kernel is loaded, before anything checks what it computes. The
// priority form constructor(101) is what a source rule looking for "constructor))" misses. Its
// body does nothing here (an empty asm statement: gcc drops constructors with empty bodies); a
// real one would run in every process that loads the kernel.
extern "C" __attribute__((constructor(101))) void kc_on_load() { __asm__ volatile(""); }

extern "C" void kc_relu_ctor(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = x[i] > 0.0f ? x[i] : (x[i] != x[i] ? x[i] : 0.0f);
  }
}
