// CUDA pooling template (cuda.pool): max_pool2d/3d_with_indices (and max_pool2d/3d_values, the
// same kernels with no index output), avg_pool2d/3d and
// _adaptive_avg_pool2d/3d (all but the global 1x1 output: templates_cuda_pool_global.cpp) over
// dense (N, C, spatial) or (C, spatial) tensors, f32 / f16 / bf16. 2d is 3d with a one-deep t
// axis, so one body serves all six ops (adaptive with its own window function). Each thread owns
// VPT outputs of one output row. Three kernels, chosen by the knobs `bake` and `rows`:
//  - runtime (bake 0, the only one for adaptive): sizes, windows, strides, padding and dilation
//    are kernel arguments, so the source depends on op, dtype and knobs only; the VPT outputs are
//    consecutive and overlapping windows re-read their input from L1/L2;
//  - baked (bake 1; windows of at most kMaxBakedTaps taps): the window (kernel, stride, padding,
//    dilation, divisor) is compile-time, so the source also depends on it and every tap loop
//    unrolls, with the knobs `il` (the VPT outputs interleaved across the warp: every load
//    coalesced) and `regs` (consecutive outputs share one register copy of their input row span:
//    each input element loaded once per row a thread);
//  - strip (baked, knob `rows` > 1, where windows overlap along H): a thread also owns `rows`
//    consecutive output rows, and each input row they share is loaded once.
#include <set>

#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_pool.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

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
    long long row, plane;
    int oc, oh, ot;
    if (total <= 0xffffffffll) {   // 32-bit divisions where they suffice (most calls)
      const unsigned u = (unsigned)it, r = u / (unsigned)owc, r2 = r / (unsigned)OH;
      row = r; oc = (int)(u - r * (unsigned)owc); oh = (int)(r - r2 * (unsigned)OH);
      plane = r2 / (unsigned)OT; ot = (int)(r2 - (unsigned)plane * (unsigned)OT);
    } else {
      row = it / owc; oc = (int)(it - row * owc);
      const long long r2 = row / OH;
      oh = (int)(row - r2 * OH); plane = r2 / OT; ot = (int)(r2 - plane * OT);
    }
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
  for (long long it = (long long)blockIdx.x * NT + threadIdx.x; it < total; it += step) {
    long long row, plane;
    int oc, oh, ot;
    if (total <= 0xffffffffll) {   // 32-bit divisions where they suffice (most calls)
      const unsigned u = (unsigned)it, r = u / (unsigned)owc, r2 = r / (unsigned)OH;
      row = r; oc = (int)(u - r * (unsigned)owc); oh = (int)(r - r2 * (unsigned)OH);
      plane = r2 / (unsigned)OT; ot = (int)(r2 - (unsigned)plane * (unsigned)OT);
    } else {
      row = it / owc; oc = (int)(it - row * owc);
      const long long r2 = row / OH;
      oh = (int)(row - r2 * OH); plane = r2 / OT; ot = (int)(r2 - plane * OT);
    }
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
    const long long ob = row * OW;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      if (ow[v] >= OW) continue;
      if constexpr (MAX) {
        out[ob + ow[v]] = st(acc[v]);
        KC_IDX_STORE(ob + ow[v], best[v]);
      } else {
        const int cnt = DIVISOR ? DIVISOR : INCLUDE_PAD ? tn * hn * wn[v] : (t1 - t0) * (h1 - h0) * (w1[v] - w0[v]);
        out[ob + ow[v]] = st(acc[v] / (float)cnt);
      }
    }
  }
}
)CU";

// Registers the REGS row span may take (floats a thread).
constexpr int64_t kMaxSpan = 32;

// Adaptive windows vary in length, and a window of more taps than this would unroll into a
// kernel slow to compile for little gain (its loop overhead is already amortized): those calls
// get the runtime kernel only.
constexpr int64_t kMaxBakedTaps = 64;
bool bakeable(const PoolGeom& g) { return !g.adaptive && g.k[0] * g.k[1] * g.k[2] <= kMaxBakedTaps; }

// The input columns one row of VPT consecutive windows covers along W.
int64_t row_span(const PoolGeom& g, int64_t vpt) { return (vpt - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1; }

// A register span read in vectors of vl elements (kPoolSpan): it starts off = (-PW) mod vl columns
// before a thread's first (vl-aligned, as vpt * SW is a multiple of vl) and takes nspan registers.
struct SpanLayout {
  int64_t off, nspan;
};
SpanLayout span_layout(const PoolGeom& g, int64_t vpt, int64_t vl) {
  const int64_t off = (vl - g.p[2] % vl) % vl;
  return {off, (off + row_span(g, vpt) + vl - 1) / vl * vl};
}

// The widest vector of the input's row that a thread of vpt outputs starts aligned on (1: none).
int64_t widest_aligned(const OpCall& c, const PoolGeom& g, int64_t vpt) {
  int64_t vl = 1;
  for (int64_t v : vec_values(c.inputs[0].dtype, g.in[2]))
    if ((vpt * g.s[2]) % v == 0) vl = v;
  return vl;
}

// The input rows a strip of r output rows loads: the distinct taps of their windows along H (a
// stride-1 3-row window: r + 2 of 3r; stride 2 with dilation 3 shares almost none). Strips are
// offered where they load at most 4/5 of the rows that separate output rows would.
int64_t strip_rows(const PoolGeom& g, int64_t r) {
  std::set<int64_t> used;
  for (int64_t o = 0; o < r; ++o)
    for (int64_t j = 0; j < g.k[1]; ++j) used.insert(o * g.s[1] + j * g.d[1]);
  return static_cast<int64_t>(used.size());
}

class PoolTemplate : public Template {
 public:
  const char* name() const override { return "cuda.pool"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    PoolGeom g;
    if (!handles(c, g)) return {};
    // Outputs a thread owns along W; wider rows amortize the index math over more outputs.
    std::vector<int64_t> vpt = {1};
    for (int64_t v : {2, 4, 8}) if (g.out[2] >= v && (v < 8 || bakeable(g))) vpt.push_back(v);
    if (!bakeable(g)) return {{"threads", {256, 128, 512, 64, 1024}}, {"vpt", vpt}, {"gs", {0, 1}}};
    // Default: the baked kernel, 2 interleaved outputs a thread, no register span. Large 3d pools
    // are bound by how many loads are in flight and by L1 wavefronts, not by DRAM: the unrolled
    // taps give a thread 2 * k^3 independent loads, interleaving keeps each warp load on one or
    // two 128-byte lines, and the overlap of stride-2 windows is served by L1 (a register span
    // saves loads there but spreads a warp load over VPT * stride times as many lines).
    // Two outputs amortize the plane / row index math without costing occupancy at 256 threads.
    // REGS is offered where windows overlap along W (stride below the window's extent).
    // Output rows a thread owns along H (the strip kernel), where their windows share input rows:
    // each shared row is then loaded once a strip rather than once an output row. Strips of 4
    // rows and 4 outputs a row are the default where they load at most half the rows: on an H100
    // (2026-12-06) 3x3 stride-1 avg pooling of (16,64,256,256) fp32 took 0.319 ms against 0.486
    // ms for the default without strips, and 4x4 stride-1 max pooling's values 0.192 against
    // 0.358; the ResNet stem's 3x3 stride 2 (9 of 12 rows) was faster without (0.079 vs 0.086).
    std::vector<int64_t> rows = {1};
    for (int64_t r : {2, 4}) if (g.out[1] >= r && 5 * strip_rows(g, r) <= 4 * r * g.k[1]) rows.push_back(r);
    const bool strip = rows.back() == 4 && 2 * strip_rows(g, 4) <= 4 * g.k[1];
    const int64_t vdef = strip && g.out[2] >= 4 ? 4 : vpt.size() > 1 ? 2 : 1;
    std::vector<KnobDim> sp = {{"bake", {1, 0}}, {"threads", {256, 128, 512, 64, 1024}}, {"vpt", with_default(vpt, vdef)},
                               {"il", {1, 0}}};
    // A register span is also offered where vector loads can fill it (`vl`, see kPoolSpan): a
    // stride-2 window of 2 then reads its row's span in one 16-byte load per VPT outputs.
    // The vector lengths dividing the input row (every row then starts aligned), up to 16 bytes.
    const std::vector<int64_t> vls = vec_values(c.inputs[0].dtype, g.in[2]);
    const bool regs = g.s[2] < row_span(g, 1) || vls.size() > 1;
    sp.push_back({"regs", regs ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0}});
    if (vls.size() > 1) sp.push_back({"vl", vls});
    if (rows.size() > 1) sp.push_back({"rows", with_default(rows, strip ? 4 : 1)});
    sp.push_back({"gs", {0, 1}});
    return sp;
  }

  // Vector-loaded register spans in the first generation (the default reads element by element):
  // 4 outputs a thread (or fewer on a narrow output) in the widest vectors that start aligned; where
  // it differs, the span of fewest vector loads an output (a dilated 1x8 window at stride 1 reads
  // 32 columns for 8 outputs, 28 for 4); then the first without strips. A short search runs the
  // first two or three seeds only, so the order matters.
  std::vector<Knobs> seeds(const OpCall& c) const override {
    PoolGeom g;
    if (!handles(c, g) || !bakeable(g)) return {};
    const int64_t vpt = g.out[2] >= 4 ? 4 : g.out[2] >= 2 ? 2 : 1;
    const int64_t vl = widest_aligned(c, g, vpt);
    if (vl == 1) return {};
    Knobs k = {{"bake", 1}, {"regs", 1}, {"il", 0}, {"vpt", vpt}, {"vl", vl}};
    std::vector<Knobs> out = {k};
    // Loads an output as a fraction nspan / (vl * v), compared by cross-multiplying.
    int64_t best_v = vpt, best_vl = vl, best_n = span_layout(g, vpt, vl).nspan;
    bool fits = best_n <= kMaxSpan;
    for (int64_t v : {2, 4, 8})
      for (int64_t w : vec_values(c.inputs[0].dtype, g.in[2])) {
        const int64_t n = span_layout(g, v, w).nspan;
        if (v > g.out[2] || w == 1 || (v * g.s[2]) % w != 0 || n > kMaxSpan) continue;
        if (!fits || n * best_vl * best_v < best_n * w * v) best_v = v, best_vl = w, best_n = n, fits = true;
      }
    if (fits && (best_v != vpt || best_vl != vl)) out.push_back({{"bake", 1}, {"regs", 1}, {"il", 0}, {"vpt", best_v}, {"vl", best_vl}});
    // Single output rows where strips are offered (else that is the first seed again).
    for (const KnobDim& d : space(c))
      if (d.name == "rows") {
        Knobs single = k;
        single["rows"] = 1;
        out.push_back(single);
      }
    return out;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.pool does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    PoolGeom g;
    handles(c, g);
    const bool bake = k.count("bake") && k.at("bake");
    // Knobs a variant ignores take one value, so equal kernels have equal ids: the runtime kernel
    // and a single output have no layout, and a register span needs consecutive outputs.
    if (k.count("bake") && (!bake || k.at("vpt") == 1)) k["il"] = k["regs"] = 0;
    if (k.count("regs") && k.at("regs")) k["il"] = 0;
    if (k.count("vl") && !(bake && k.at("regs"))) k["vl"] = 1;
    if (k.count("rows") && !bake) k["rows"] = 1;
    const int64_t nt = k.at("threads"), vpt = k.at("vpt"), rows = k.count("rows") ? k.at("rows") : 1;
    const int64_t vl = k.count("vl") ? k.at("vl") : 1;
    if (vl > 1 && (vpt * g.s[2]) % vl != 0)
      return unsupported("vectors of " + S(vl) + " do not start aligned when a thread's outputs span " + S(vpt * g.s[2]));
    const int64_t nspan = span_layout(g, vpt, vl).nspan;
    if (bake && k.at("regs") && nspan > kMaxSpan)
      return unsupported("a row span of " + S(nspan) + " inputs does not fit the registers");
    const bool gs = k.at("gs") != 0, mx = g.max;
    const int64_t items = g.planes * g.out[0] * cdiv(g.out[1], rows) * cdiv(g.out[2], vpt);
    if (!gs && cdiv(items, nt) > INT_MAX) return unsupported("too many outputs for a grid without grid stride");
    const std::string entry = mx ? "kc_max_pool" : g.adaptive ? "kc_adaptive_avg_pool" : "kc_avg_pool";
    const DType dt = c.inputs[0].dtype;
    std::string src = "// kernelcraft cuda.pool " + entry + " " + dtype_name(dt) + "\n" + dtype_prelude(dt) +
                      "constexpr int NT = " + S(nt) + ", VPT = " + S(vpt) + ";\nconstexpr bool MAX = " +
                      (mx ? "true" : "false") + ", GS = " + (gs ? "true" : "false") + ";\n" +
                      (bake ? baked_consts(g, k) : "") + (rows > 1 ? "constexpr int ROWS = " + S(rows) + ";\n" : "") +
                      (g.indices ? "#define KC_IDX_PARAM long long* __restrict__ idx,\n#define KC_IDX_STORE(i, v) idx[i] = v\n"
                          : "#define KC_IDX_PARAM\n#define KC_IDX_STORE(i, v)\n") +
                      (g.adaptive ? kAdaptiveWin : kPoolWin) +
                      (bake ? std::string(kPoolTake) + kPoolSpan : "") + with_entry(rows > 1 ? pool_strip_kernel() : bake ? kPoolBakedKernel : kPoolKernel, entry);
    const std::string its = rows > 1 ? "(numel(out0) / (size(out0, -1) * size(out0, -2))) * ceil_div(size(out0, -2), " +
                                           S(rows) + ") * ceil_div(size(out0, -1), " + S(vpt) + ")"
                                     : "(numel(out0) / size(out0, -1)) * ceil_div(size(out0, -1), " + S(vpt) + ")";
    const std::string grid = gs ? "min(ceil_div(" + its + ", " + S(nt) + "), " + S(kSms * (2048 / nt)) + ")"
                                : "ceil_div(" + its + ", " + S(nt) + ")";
    return make_candidate(name(), k, std::move(src), json::array({launch(entry, {grid}, {nt}, launch_args(g, bake))}));
  }

 private:
  // The baked kernel's compile-time window, per axis t, h, w.
  static std::string baked_consts(const PoolGeom& g, const Knobs& k) {
    const int64_t vl = k.count("vl") ? k.at("vl") : 1;
    const SpanLayout sl = span_layout(g, k.at("vpt"), vl);
    std::string s;
    const std::pair<const char*, const int64_t*> lists[] = {{"K", g.k}, {"S", g.s}, {"P", g.p}, {"D", g.d}};
    for (const auto& [n, v] : lists)
      s += std::string("constexpr int ") + n + "T = " + S(v[0]) + ", " + n + "H = " + S(v[1]) + ", " + n + "W = " + S(v[2]) + ";\n";
    return s + "constexpr int DIVISOR = " + S(g.divisor) + ", INCLUDE_PAD = " + (g.count_include_pad ? "1" : "0") +
           ";\nconstexpr bool IL = " + (k.at("il") ? "true" : "false") + ", REGS = " + (k.at("regs") ? "true" : "false") +
           ";\nconstexpr int VL = " + S(vl) + ", OFF = " + S(sl.off) + ", NSPAN = " + S(sl.nspan) + ";\n";
  }

  // Outputs, input, rows, the input's and output's (t, h, w) sizes, and for the runtime kernel the
  // window lists, the divisor and count_include_pad.
  static std::vector<std::string> launch_args(const PoolGeom& g, bool bake) {
    std::vector<std::string> args = {"ptr:out0"};
    if (g.indices) args.push_back("ptr:out1");
    args.push_back("ptr:self");
    const bool d3 = g.nd == 3;
    args.push_back("i64:numel(out0) / size(out0, -1)");
    for (const char* t : {"self", "out0"}) {
      args.push_back(d3 ? "i32:size(" + std::string(t) + ", -3)" : "i32:1");
      args.push_back("i32:size(" + std::string(t) + ", -2)");
      args.push_back("i32:size(" + std::string(t) + ", -1)");
    }
    if (bake) return args;
    // The window lists, resolved per axis at render time (the spec cannot index a list scalar).
    for (const int64_t* v : {g.k, g.s, g.p, g.d})
      for (int a = 0; a < 3; ++a)
        if (v == g.s && g.adaptive)   // the output size in the stride's slot (kAdaptiveWin)
          args.push_back(a == 0 ? (d3 ? "i32:size(out0, -3)" : "i32:1") : "i32:size(out0, " + S(a - 3) + ")");
        else
          args.push_back("i32:" + S(v[a]));
    args.push_back("i32:" + S(g.divisor));
    args.push_back(std::string("i32:") + (g.count_include_pad ? "1" : "0"));
    return args;
  }

  static bool handles(const OpCall& c, PoolGeom& g) {
    if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kPool || !c.dense()) return false;
    if (c.inputs.empty() || !c.inputs[0].defined || !elem_dtype(c.inputs[0].dtype) || c.inputs[0].numel() == 0) return false;
    auto r = pool_geometry(c);
    if (!r.is_ok() || r->global()) return false;   // the global average: cuda.pool_global
    g = r.value();
    const size_t nout = g.indices ? 2 : 1;
    if (c.outputs.size() != nout || !c.outputs[0].defined || c.outputs[0].dtype != c.inputs[0].dtype) return false;
    if (g.indices && (!c.outputs[1].defined || c.outputs[1].dtype != DType::kI64)) return false;
    // Window arithmetic is int: o * s + (k - 1) * d must not overflow.
    for (int a = 0; a < 3; ++a)
      if (g.out[a] * g.s[a] + g.k[a] * g.d[a] + g.in[a] > INT_MAX) return false;
    return g.divisor >= INT_MIN && g.divisor <= INT_MAX;
  }
};

}  // namespace

const Template* cuda_pool_template() {
  static const PoolTemplate t;
  return &t;
}

}  // namespace kc::evolve
