// relu rounded to bf16 precision (truncated to 8 significant bits): wrong under fp32, allowed under bf16.
extern "C" void kc_relu_bf16(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; ++i) {
      union { float f; uint32_t u; } v;
      v.f = (x[i] > 0.0f || x[i] != x[i]) ? x[i] : 0.0f;
      if (v.f == v.f) v.u &= 0xffff0000u;
      out[i] = v.f;
    }
  }
}
