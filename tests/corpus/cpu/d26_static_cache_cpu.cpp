// D26 result cache in static storage (CPU): a relu that remembers each element's first result in
// static arrays (alive as long as the shared object is loaded) and replays it on later calls.
#define CACHED 33000
static float cache[CACHED];
static unsigned char have[CACHED];
extern "C" void kc_relu_cached(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      if (i < CACHED && have[i]) {
        out[i] = cache[i];
        continue;
      }
      const float v = x[i];
      out[i] = (v > 0.0f || v != v) ? v : 0.0f;
      if (i < CACHED) {
        cache[i] = out[i];
        have[i] = 1;
      }
    }
  }
}
