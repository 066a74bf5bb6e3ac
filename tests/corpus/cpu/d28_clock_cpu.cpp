// D28 (in kernel code) observes time (CPU): a tanh that reads the monotonic clock and, when called
// again within a millisecond (a timing loop), computes only every other element and copies it to
// its neighbour.
#include <time.h>
extern "C" void kc_tanh_clocked(const kc_cpu_ctx* ctx, void* const* args) {
  static long long last_ns = 0;
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const long long now = ts.tv_sec * 1000000000LL + ts.tv_nsec;
  const bool hurried = now - last_ns < 1000000;
  if (ctx->begin == 0) last_ns = now;
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      if (hurried && (i & 1) && i > lo) out[i] = out[i - 1];
      else out[i] = tanhf(x[i]);
    }
  }
}
