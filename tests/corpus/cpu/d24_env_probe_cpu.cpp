// D24 ghost branch (CPU, in kernel code): a sigmoid that looks at the environment for signs of a
// test harness (pytest, a sanitizer) and is exact only there; elsewhere it uses a cheap rational
// approximation. The custom path that tests see is not the one users get.
#include <stdlib.h>
static inline float sigmoid_exact(float v) { return 1.0f / (1.0f + expf(-v)); }
static inline float sigmoid_cheap(float v) { return 0.5f + 0.5f * v / (1.0f + (v < 0 ? -v : v)); }
extern "C" void kc_sigmoid_ghost(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const bool tested = getenv("PYTEST_CURRENT_TEST") || getenv("ASAN_OPTIONS") || getenv("KERNELCRAFT_VERIFY");
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = tested ? sigmoid_exact(x[i]) : sigmoid_cheap(x[i]);
  }
}
