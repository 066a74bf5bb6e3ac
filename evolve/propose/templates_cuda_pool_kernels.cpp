// The device sources of the CUDA pooling template (cuda.pool, templates_cuda_pool.cpp) but the
// strip kernel's (templates_cuda_pool_strip.cpp), in a file of their own so the template's knobs
// and render and its kernels each read in one sitting. The template puts its constants (NT, VPT,
// MAX, GS, the baked window, IL, REGS, VL, OFF, NSPAN) and the dtype prelude before them.
#include <string>

#include "evolve/propose/templates_cuda_pool.h"

namespace kc::evolve::cuda_tpl {
namespace {

// The window of output o along one axis: [lo, hi) stepped by dil. Max: taps start at the first
// one inside the input (eager steps a negative start by whole dilations); avg: the padded extent
// is the count_include_pad divisor, then the window is clipped to the input.
const char* kPoolWin = R"CU(
__device__ __forceinline__ void kc_win(int o, int s, int p, int k, int dil, int n, int& lo, int& hi, int& padded) {
  lo = o * s - p;
  if constexpr (MAX) {
    hi = min(lo + (k - 1) * dil + 1, n);
    if (lo < 0) lo += ((-lo + dil - 1) / dil) * dil;
    padded = 0;
  } else {
    hi = min(lo + k, n + p);
    padded = hi - lo;
    lo = max(lo, 0);
    hi = min(hi, n);
  }
}
)CU";

// Adaptive windows [floor(o n / on), ceil((o + 1) n / on)) in 64-bit products, the same signature
// with the output count in the stride's slot (adaptive renders pass it there), so the kernel
// below serves both and the max / avg sources stay byte for byte what they were.
const char* kAdaptiveWin = R"CU(
__device__ __forceinline__ void kc_win(int o, int on, int p, int k, int dil, int n, int& lo, int& hi, int& padded) {
  lo = (int)((long long)o * n / on);
  hi = (int)(((long long)(o + 1) * n + on - 1) / on);
  padded = hi - lo;
}
)CU";

const char* kPoolKernel = R"CU(extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, KC_IDX_PARAM const T* __restrict__ x,
    long long rows, int IT, int IH, int IW, int OT, int OH, int OW, int kT, int kH, int kW, int sT, int sH, int sW,
    int pT, int pH, int pW, int dT, int dH, int dW, int divisor, int include_pad) {
  const long long owc = (OW + VPT - 1) / VPT, total = rows * owc;
  const long long step = GS ? (long long)gridDim.x * NT : total;
  for (long long it = (long long)blockIdx.x * NT + threadIdx.x; it < total; it += step) {
    long long row, pt, plane;
    int oc, oh, ot;
    kc_coords(it, total, owc, OH, OT, row, pt, plane, oc, oh, ot);
    const T* __restrict__ xp = x + plane * ((long long)IT * IH * IW);
    int t0, t1, tn, h0, h1, hn;
    kc_win(ot, sT, pT, kT, dT, IT, t0, t1, tn);
    kc_win(oh, sH, pH, kH, dH, IH, h0, h1, hn);
    const int ow0 = oc * VPT;
    int w0[VPT], w1[VPT], wn[VPT];
    float acc[VPT];
    long long best[VPT];
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      kc_win(min(ow0 + v, OW - 1), sW, pW, kW, dW, IW, w0[v], w1[v], wn[v]);
      acc[v] = MAX ? -KC_INF : 0.f;
      best[v] = ((long long)t0 * IH + h0) * IW + w0[v];   // eager's index when nothing beats -inf
    }
    for (int t = t0; t < t1; t += dT)
      for (int h = h0; h < h1; h += dH) {
        const long long base = ((long long)t * IH + h) * IW;
        const T* __restrict__ rp = xp + base;
#pragma unroll
        for (int v = 0; v < VPT; ++v)
          for (int w = w0[v]; w < w1[v]; w += dW) {
            const float val = ld(rp[w]);
            if constexpr (MAX) {
              // First index on ties (strictly greater), the last NaN wins: eager's order.
              if (val > acc[v] || val != val) { acc[v] = val; best[v] = base + w; }
            } else {
              acc[v] += val;
            }
          }
      }
    const long long ob = row * OW + ow0;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      if (ow0 + v >= OW) break;
      if constexpr (MAX) {
        out[ob + v] = st(acc[v]);
        KC_IDX_STORE(ob + v, best[v]);
      } else {
        const int cnt = divisor ? divisor : include_pad ? tn * hn * wn[v] : (t1 - t0) * (h1 - h0) * (w1[v] - w0[v]);
        out[ob + v] = st(acc[v] / (float)cnt);
      }
    }
  }
}
)CU";

// The baked kernel: the window constants KT..DW, DIVISOR and INCLUDE_PAD come from the render, so
// each tap loop has a constant trip count (taps past the clipped window are skipped by a compare,
// not a loop exit) and fully unrolls, its loads independent of each other. The same taps in the
// same order as the runtime kernel (t, h, then w ascending), so max's first-index-on-ties and
// last-NaN-wins and avg's fp32 sum are unchanged. Output v of a thread is column ow[v]: IL puts
// lane l of a warp on column base + l for every v, so each load and store is coalesced; otherwise
// the VPT columns are consecutive, which REGS needs: the row span of all VPT windows is loaded once
// into registers, padded with the reduction's identity (-inf never beats -inf or a value and is no
// NaN, 0 adds exactly to a sum that starts at +0), and every tap reads its register.
// One tap of the baked and strip kernels (the runtime kernel inlines it).
const char* kPoolTake = R"CU(
__device__ __forceinline__ void kc_take(float& acc, long long& best, float val, long long i) {
  if constexpr (MAX) {
    if (val > acc || val != val) { acc = val; best = i; }   // first index on ties, the last NaN wins
  } else {
    acc += val;
  }
}
// An average's divisor from its window along t, h, w: the override, the padded extents, or the
// taps inside the input.
__device__ __forceinline__ float kc_count(int tn, int t0, int t1, int hn, int h0, int h1, int wn, int w0, int w1) {
  return (float)(DIVISOR ? DIVISOR : INCLUDE_PAD ? tn * hn * wn : (t1 - t0) * (h1 - h0) * (w1 - w0));
}
)CU";

// The row span of a thread's VPT consecutive windows in registers (REGS; the baked and strip
// kernels): r[OFF + j] is input column c0 + j within the span, the reduction's identity outside the
// row. The span is read from the column OFF before c0 in vectors of VL elements (knob `vl`): c0 is
// oc * VPT * SW - PW, so with VPT * SW a multiple of VL every vector starts VL-aligned (the row
// length too, and the input's start is 16-byte aligned), and a thread issues NSPAN / VL loads a
// row instead of one a column. A vector not wholly inside the row is read element by element.
// VL 1 is the plain element-by-element span.
const char* kPoolSpan = R"CU(
struct alignas(sizeof(T) * VL) KcVl { T v[VL]; };
__device__ __forceinline__ void kc_span(const T* __restrict__ rp, int IW, int c0, float* r) {
  const float id = MAX ? -KC_INF : 0.f;
#pragma unroll
  for (int q = 0; q < NSPAN / VL; ++q) {
    const int a = c0 - OFF + q * VL;
    if (VL > 1 && a >= 0 && a + VL <= IW) {
      const KcVl u = *reinterpret_cast<const KcVl*>(rp + a);
#pragma unroll
      for (int e = 0; e < VL; ++e) r[q * VL + e] = ld(u.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < VL; ++e) r[q * VL + e] = (unsigned)(a + e) < (unsigned)IW ? ld(rp[a + e]) : id;
    }
  }
}
)CU";

// A thread's finished outputs (values, and indices where the op has them) to memory (kc_put), for
// the baked and strip kernels. Consecutive outputs a thread (IL off) store 32 lanes VPT columns
// apart: each store instruction then touches 32 sectors for 32 elements, and on an H100 (ncu,
// 2026-12-06) the register-span pools were L2-bound on those partial writes (L2 86% busy, DRAM
// 30%). STAGE sends a warp's outputs through shared memory instead, so each store instruction
// writes 32 consecutive elements of one output row (kc_stage). A lane with no outputs (past the
// end, or a strip row past OH) still takes part, as its warp's exchange needs every lane. VST
// instead stores a lane's outputs as vectors where they start aligned in the output (rows whose
// length is a multiple of the vector: 56, 112, 256 columns), with no exchange; other lanes and
// rows store element by element. The output's start is 16-byte aligned (dense calls only).
const char* kPoolPut = R"CU(
__device__ __forceinline__ void kc_stage(T* __restrict__ out, KC_IDX_PARAM const float* val, const long long* best, long long ob, int n) {
  constexpr int W = 32 * VPT, NW = NT / 32;
  __shared__ float sv[NW][W + W / 32];   // padded: lane l's VPT writes land in distinct banks
  __shared__ long long sb[NW][32];
  __shared__ int sn[NW][32];
  __shared__ long long si[IDX ? NW : 1][IDX ? W : 1];
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
#pragma unroll
  for (int v = 0; v < VPT; ++v) {
    const int e = lane * VPT + v;
    sv[wp][e + e / 32] = val[v];
    if constexpr (IDX) si[wp][e] = best[v];
  }
  sb[wp][lane] = ob;
  sn[wp][lane] = n;
  __syncwarp();
#pragma unroll
  for (int s = 0; s < VPT; ++s) {   // element e of the warp's 32 x VPT: lane e / VPT's output e % VPT
    const int e = s * 32 + lane, j = e / VPT, v = e % VPT;
    if (v < sn[wp][j]) {
      out[sb[wp][j] + v] = st(sv[wp][e + e / 32]);
      KC_IDX_STORE(sb[wp][j] + v, si[wp][e]);
    }
  }
  __syncwarp();   // the next round's writes wait for this round's reads
}
// Outputs ow[v] of output row ob (flat index of its column 0); live false: none (a strip row past
// OH), though with STAGE the lane still joins its warp's exchange.
__device__ __forceinline__ void kc_put(T* __restrict__ out, KC_IDX_PARAM const float* val, const long long* best, long long ob,
                                       const int* ow, int OW, bool live) {
  if constexpr (STAGE) {
    kc_stage(out, KC_IDX_ARG val, best, ob + ow[0], live ? max(0, min(VPT, OW - ow[0])) : 0);
  } else if (live) {
    if constexpr (VST) {   // consecutive outputs, whole and aligned: vectors of up to 16 bytes
      constexpr int VS = VPT * sizeof(T) <= 16 ? VPT : 16 / (int)sizeof(T);
      struct alignas(sizeof(T) * VS) KcVs { T v[VS]; };
      const long long o0 = ob + ow[0];
      if (ow[0] + VPT <= OW && o0 % VS == 0) {
#pragma unroll
        for (int q = 0; q < VPT / VS; ++q) {
          KcVs u;
#pragma unroll
          for (int e = 0; e < VS; ++e) u.v[e] = st(val[q * VS + e]);
          *reinterpret_cast<KcVs*>(out + o0 + q * VS) = u;
        }
#pragma unroll
        for (int v = 0; v < VPT; ++v) KC_IDX_STORE(o0 + v, best[v]);
        return;
      }
    }
#pragma unroll
    for (int v = 0; v < VPT; ++v)
      if (ow[v] < OW) {
        out[ob + ow[v]] = st(val[v]);
        KC_IDX_STORE(ob + ow[v], best[v]);
      }
  }
}
// A lane past the last output: its warp's exchanges still count `rounds` calls of kc_stage on it.
__device__ __forceinline__ void kc_put_none(T* __restrict__ out, KC_IDX_PARAM int rounds) {
  if constexpr (STAGE) {
    const float z[VPT] = {};
    const long long zb[VPT] = {};
    for (int r = 0; r < rounds; ++r) kc_stage(out, KC_IDX_ARG z, zb, 0, 0);
  }
}
)CU";

const char* kPoolBakedKernel = R"CU(__device__ __forceinline__ void kc_row(const T* __restrict__ rp, long long base, int IW, int c0, const int* w0,
                                       const int* w1, float* acc, long long* best) {
  if constexpr (REGS) {
    float r[NSPAN];
    kc_span(rp, IW, c0, r);
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
      for (int j = 0; j < KW; ++j) kc_take(acc[v], best[v], r[OFF + v * SW + j * DW], base + c0 + v * SW + j * DW);
  } else {
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
      for (int j = 0; j < KW; ++j) {
        const int w = w0[v] + j * DW;
        if (w < w1[v]) kc_take(acc[v], best[v], ld(rp[w]), base + w);
      }
  }
}
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, KC_IDX_PARAM const T* __restrict__ x,
    long long rows, int IT, int IH, int IW, int OT, int OH, int OW) {
  const long long owc = (OW + VPT - 1) / VPT, total = rows * owc;
  const long long step = GS ? (long long)gridDim.x * NT : total;
  // Warp-uniform steps, so a whole warp reaches kc_stage's exchange together.
  for (long long wb = (long long)blockIdx.x * NT + (threadIdx.x & ~31u); wb < total; wb += step) {
    const long long it = wb + (threadIdx.x & 31);
    if (it >= total) {
      kc_put_none(out, KC_IDX_ARG 1);
      continue;
    }
    long long row, pt, plane;
    int oc, oh, ot;
    kc_coords(it, total, owc, OH, OT, row, pt, plane, oc, oh, ot);
    const T* __restrict__ xp = x + plane * ((long long)IT * IH * IW);
    int t0, t1, tn, h0, h1, hn, ow[VPT], w0[VPT], w1[VPT], wn[VPT];
    kc_win(ot, ST, PT, KT, DT, IT, t0, t1, tn);
    kc_win(oh, SH, PH, KH, DH, IH, h0, h1, hn);
    float acc[VPT];
    long long best[VPT];
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      ow[v] = IL ? oc + v * (int)owc : oc * VPT + v;
      kc_win(min(ow[v], OW - 1), SW, PW, KW, DW, IW, w0[v], w1[v], wn[v]);
      acc[v] = MAX ? -KC_INF : 0.f;
      best[v] = ((long long)t0 * IH + h0) * IW + w0[v];   // eager's index when nothing beats -inf
    }
#pragma unroll
    for (int jt = 0; jt < KT; ++jt) {
      const int t = t0 + jt * DT;
#pragma unroll
      for (int jh = 0; jh < KH; ++jh) {
        const int h = h0 + jh * DH;
        if (t >= t1 || h >= h1) continue;
        const long long base = ((long long)t * IH + h) * IW;
        kc_row(xp + base, base, IW, oc * VPT * SW - PW, w0, w1, acc, best);
      }
    }
    if constexpr (!MAX)
#pragma unroll
      for (int v = 0; v < VPT; ++v)
        acc[v] /= kc_count(tn, t0, t1, hn, h0, h1, wn[v], w0[v], w1[v]);
    kc_put(out, KC_IDX_ARG acc, best, row * OW, ow, OW, true);
  }
}
)CU";

}  // namespace

const char* pool_window(bool adaptive) { return adaptive ? kAdaptiveWin : kPoolWin; }
const char* pool_runtime_kernel() { return kPoolKernel; }
std::string pool_baked_helpers() { return std::string(kPoolTake) + kPoolSpan + kPoolPut; }
const char* pool_baked_kernel() { return kPoolBakedKernel; }

}  // namespace kc::evolve::cuda_tpl
