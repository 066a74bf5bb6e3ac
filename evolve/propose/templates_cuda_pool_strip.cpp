// The strip kernel of the CUDA pooling template (cuda.pool, templates_cuda_pool.cpp), in a file of
// its own so the template's render logic and its kernel sources each read in one sitting. It is
// appended after the template's window function (kc_win), tap (kc_take) and baked window
// constants, so it names them freely.
#include "evolve/propose/templates_cuda_pool.h"

namespace kc::evolve::cuda_tpl {
namespace {

// The strip kernel (baked, knob `rows` > 1): a thread owns ROWS consecutive output rows along H
// (one plane and t) as well as its VPT columns, so where windows overlap along H (stride below the
// dilated extent) each input row of the strip's span is loaded once into registers and taken by
// every output row whose window holds it, instead of once per output row: a 3x3 stride-1 window
// over 4 rows loads 6 rows, not 12. kc_tap says at compile time which output rows take input row i
// of the span; taps outside the input are skipped (the window clipping of kc_win, since a tap of
// the lattice inside the input is inside the clipped window). Each output still takes its taps in
// (t, h, w) order, so max's ties and NaNs and avg's fp32 sum are the other kernels' bit for bit.
const char* const kPoolStripKernel = R"CU(
constexpr int HSPAN = (ROWS - 1) * SH + (KH - 1) * DH + 1, NV = REGS ? NSPAN : VPT * KW;
__device__ __forceinline__ constexpr bool kc_tap(int i, int r) {
  return i >= r * SH && (i - r * SH) % DH == 0 && (i - r * SH) / DH < KH;
}
__device__ __forceinline__ constexpr bool kc_used(int i) {
  bool u = false;
  for (int r = 0; r < ROWS; ++r) u = u || kc_tap(i, r);
  return u;
}
// One input row's taps into registers, the reduction's identity where a tap is outside the row
// (-inf never beats -inf or a value and is no NaN; +0 leaves a sum that starts at +0 exact).
__device__ __forceinline__ void kc_load(const T* __restrict__ rp, int IW, int c0, const int* w0, const int* w1, float* r) {
  const float id = MAX ? -KC_INF : 0.f;
  if constexpr (REGS) {
    kc_span(rp, IW, c0, r);
  } else {
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
      for (int j = 0; j < KW; ++j) {
        const int w = w0[v] + j * DW;
        r[v * KW + j] = w < w1[v] ? ld(rp[w]) : id;
      }
  }
}
__device__ __forceinline__ void kc_apply(const float* r, long long base, int c0, const int* w0, float* acc, long long* best) {
#pragma unroll
  for (int v = 0; v < VPT; ++v)
#pragma unroll
    for (int j = 0; j < KW; ++j)
      if constexpr (REGS) kc_take(acc[v], best[v], r[OFF + v * SW + j * DW], base + c0 + v * SW + j * DW);
      else kc_take(acc[v], best[v], r[v * KW + j], base + w0[v] + j * DW);
}
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, KC_IDX_PARAM const T* __restrict__ x,
    long long rows, int IT, int IH, int IW, int OT, int OH, int OW) {
  const long long owc = (OW + VPT - 1) / VPT, ohc = (OH + ROWS - 1) / ROWS, total = rows / OH * ohc * owc;
  const long long step = GS ? (long long)gridDim.x * NT : total;
  // Warp-uniform steps, so a whole warp reaches kc_stage's exchanges together.
  for (long long wb = (long long)blockIdx.x * NT + (threadIdx.x & ~31u); wb < total; wb += step) {
    const long long it = wb + (threadIdx.x & 31);
    if (it >= total) {
      kc_put_none(out, KC_IDX_ARG ROWS);
      continue;
    }
    long long r1, pt, plane;   // pt: the (plane, t) of the strip
    int oc, oh0, ot;
    kc_coords(it, total, owc, (int)ohc, OT, r1, pt, plane, oc, oh0, ot);
    oh0 *= ROWS;
    const T* __restrict__ xp = x + plane * ((long long)IT * IH * IW);
    int t0, t1, tn, h0[ROWS], h1[ROWS], hn[ROWS], ow[VPT], w0[VPT], w1[VPT], wn[VPT];
    kc_win(ot, ST, PT, KT, DT, IT, t0, t1, tn);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) kc_win(min(oh0 + r, OH - 1), SH, PH, KH, DH, IH, h0[r], h1[r], hn[r]);
    float acc[ROWS][VPT];
    long long best[ROWS][VPT];
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      ow[v] = IL ? oc + v * (int)owc : oc * VPT + v;
      kc_win(min(ow[v], OW - 1), SW, PW, KW, DW, IW, w0[v], w1[v], wn[v]);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        acc[r][v] = MAX ? -KC_INF : 0.f;
        best[r][v] = ((long long)t0 * IH + h0[r]) * IW + w0[v];   // eager's index when nothing beats -inf
      }
    }
    const int c0 = oc * VPT * SW - PW, hb = oh0 * SH - PH;
#pragma unroll
    for (int jt = 0; jt < KT; ++jt) {
      const int t = t0 + jt * DT;
      if (t >= t1) continue;
#pragma unroll
      for (int i = 0; i < HSPAN; ++i) {
        const int h = hb + i;
        if (!kc_used(i) || (unsigned)h >= (unsigned)IH) continue;
        const long long base = ((long long)t * IH + h) * IW;
        float r[NV];
        kc_load(xp + base, IW, c0, w0, w1, r);
#pragma unroll
        for (int o = 0; o < ROWS; ++o)
          if (kc_tap(i, o)) kc_apply(r, base, c0, w0, acc[o], best[o]);
      }
    }
#pragma unroll
    for (int o = 0; o < ROWS; ++o) {
      if constexpr (!MAX)
#pragma unroll
        for (int v = 0; v < VPT; ++v)
          acc[o][v] /= kc_count(tn, t0, t1, hn[o], h0[o], h1[o], wn[v], w0[v], w1[v]);
      kc_put(out, KC_IDX_ARG acc[o], best[o], (pt * OH + oh0 + o) * OW, ow, OW, oh0 + o < OH);
    }
  }
}
)CU";

}  // namespace

const char* pool_strip_kernel() { return kPoolStripKernel; }

}  // namespace kc::evolve::cuda_tpl
