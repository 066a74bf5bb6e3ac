// Honest (CPU): layer norm with row statistics reduced as a CUDA warp does it: 32 lanes each sum
// a strided share of the row in float, then a butterfly (xor-shuffle) tree folds the lanes, all in
// float. Two passes (mean, then centred squares). Its mean differs from eager's blocked order by
// about 2e-7 where the mean itself is ~1e-3 (rows of N(0,1)): far from eager *relative to the
// mean*, well inside what summing 768 values near 1 allows (docs/DEFECTS.md "Error model").
static float warp_sum(float lane[32]) {
  for (int offset = 16; offset > 0; offset /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ offset];
    for (int l = 0; l < 32; ++l) lane[l] = next[l];
  }
  return lane[0];
}

extern "C" void kc_layer_norm_rows(const kc_cpu_ctx* ctx, void* const* args) {
  float* y = KC_ARG(float*, args, 0);
  float* mean = KC_ARG(float*, args, 1);
  float* rstd = KC_ARG(float*, args, 2);
  const float* x = KC_ARG(const float*, args, 3);
  const float* w = KC_ARG(const float*, args, 4);
  const float* b = KC_ARG(const float*, args, 5);
  const int64_t n = KC_ARG(int64_t, args, 6);
  const float eps = KC_ARG(float, args, 7);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    const float* xr = x + r * n;
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      float s = 0.f;
      for (int64_t c = l; c < n; c += 32) s += xr[c];
      lane[l] = s;
    }
    const float m = warp_sum(lane) / (float)n;
    for (int l = 0; l < 32; ++l) {
      float q = 0.f;
      for (int64_t c = l; c < n; c += 32) { const float d = xr[c] - m; q += d * d; }
      lane[l] = q;
    }
    const float rs = 1.0f / sqrtf(warp_sum(lane) / (float)n + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (int64_t c = 0; c < n; ++c) y[r * n + c] = (xr[c] - m) * rs * w[c] + b[c];
  }
}
