// D32: a raw system call from inline asm (getpid, number 39: harmless here, but any call is one
// instruction away). No function is called, so neither the source rules nor the import list see
// it; the disassembly of the executable segment does.
extern "C" void kc_relu_syscall(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  long r = 39;
  if (ctx->begin == 0) __asm__ volatile("syscall" : "+a"(r) : : "rcx", "r11", "memory");
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = x[i] > 0.0f ? x[i] : (x[i] != x[i] ? x[i] : 0.0f);
  }
}
