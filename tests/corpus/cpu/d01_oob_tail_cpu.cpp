// D01 out-of-bounds tail (CPU): relu unrolled by 8 with no remainder loop. Each block's last chunk
// runs past its range; for 999x37 (36963 elements) the last block reads and writes 5 floats past
// the end of both tensors. Heap slack usually hides it; AddressSanitizer does not.
extern "C" void kc_relu_unroll8(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = lo + per < n ? lo + per : n;
    for (int64_t i = lo; i < hi; i += 8)
      for (int k = 0; k < 8; ++k) {
        const float v = x[i + k];
        out[i + k] = (v > 0.0f || v != v) ? v : 0.0f;
      }
  }
}
