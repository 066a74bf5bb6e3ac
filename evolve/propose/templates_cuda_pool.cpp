// CUDA pooling template (cuda.pool): max_pool2d/3d_with_indices, avg_pool2d/3d and
// _adaptive_avg_pool2d/3d (all but the global 1x1 output: templates_cuda_pool_global.cpp) over
// dense (N, C, spatial) or (C, spatial) tensors, f32 / f16 / bf16. 2d is 3d with a one-deep t
// axis, so one body serves all six ops (adaptive with its own window function). Each thread owns VPT consecutive outputs of one output row; sizes,
// windows, strides, padding and dilation are kernel arguments (the lists become literal int
// arguments at render time), so the source depends on op, dtype and knobs only. Overlapping
// windows re-read their input from L1/L2; adjacent threads read adjacent columns (coalesced).
#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cuda_common.h"

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

bool is_max(OpId op) { return op == OpId::kMaxPool2d || op == OpId::kMaxPool3d; }

class PoolTemplate : public Template {
 public:
  const char* name() const override { return "cuda.pool"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    PoolGeom g;
    if (!handles(c, g)) return {};
    // Outputs a thread owns along W; wider rows amortize the index math over more outputs.
    std::vector<int64_t> vpt = {1};
    for (int64_t v : {2, 4}) if (g.out[2] >= v) vpt.push_back(v);
    return {{"threads", {256, 128, 512, 64, 1024}}, {"vpt", vpt}, {"gs", {0, 1}}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.pool does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    const Knobs k = kr.value();
    PoolGeom g;
    handles(c, g);
    const int64_t nt = k.at("threads"), vpt = k.at("vpt");
    const bool gs = k.at("gs") != 0, mx = is_max(c.op);
    const int64_t items = g.planes * g.out[0] * g.out[1] * cdiv(g.out[2], vpt);
    if (!gs && cdiv(items, nt) > INT_MAX) return unsupported("too many outputs for a grid without grid stride");
    const std::string entry = mx ? "kc_max_pool" : g.adaptive ? "kc_adaptive_avg_pool" : "kc_avg_pool";
    const DType dt = c.inputs[0].dtype;
    std::string src = "// kernelcraft cuda.pool " + entry + " " + dtype_name(dt) + "\n" + dtype_prelude(dt) +
                      "constexpr int NT = " + S(nt) + ", VPT = " + S(vpt) + ";\nconstexpr bool MAX = " +
                      (mx ? "true" : "false") + ", GS = " + (gs ? "true" : "false") + ";\n" +
                      (mx ? "#define KC_IDX_PARAM long long* __restrict__ idx,\n#define KC_IDX_STORE(i, v) idx[i] = v\n"
                          : "#define KC_IDX_PARAM\n#define KC_IDX_STORE(i, v)\n") +
                      (g.adaptive ? kAdaptiveWin : kPoolWin) + with_entry(kPoolKernel, entry);
    std::vector<std::string> args = {"ptr:out0"};
    if (mx) args.push_back("ptr:out1");
    args.push_back("ptr:self");
    const bool d3 = g.nd == 3;
    args.push_back("i64:numel(out0) / size(out0, -1)");
    for (const char* t : {"self", "out0"}) {
      args.push_back(d3 ? "i32:size(" + std::string(t) + ", -3)" : "i32:1");
      args.push_back("i32:size(" + std::string(t) + ", -2)");
      args.push_back("i32:size(" + std::string(t) + ", -1)");
    }
    // The window lists, resolved per axis at render time (the spec cannot index a list scalar).
    for (const int64_t* v : {g.k, g.s, g.p, g.d})
      for (int a = 0; a < 3; ++a)
        if (v == g.s && g.adaptive)   // the output size in the stride's slot (kAdaptiveWin)
          args.push_back(a == 0 ? (d3 ? "i32:size(out0, -3)" : "i32:1") : "i32:size(out0, " + S(a - 3) + ")");
        else
          args.push_back("i32:" + S(v[a]));
    args.push_back("i32:" + S(g.divisor));
    args.push_back(std::string("i32:") + (g.count_include_pad ? "1" : "0"));
    const std::string its = "(numel(out0) / size(out0, -1)) * ceil_div(size(out0, -1), " + S(vpt) + ")";
    const std::string grid = gs ? "min(ceil_div(" + its + ", " + S(nt) + "), " + S(kSms * (2048 / nt)) + ")"
                                : "ceil_div(" + its + ", " + S(nt) + ")";
    return make_candidate(name(), k, std::move(src), json::array({launch(entry, {grid}, {nt}, args)}));
  }

 private:
  static bool handles(const OpCall& c, PoolGeom& g) {
    if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kPool || !c.dense()) return false;
    if (c.inputs.empty() || !c.inputs[0].defined || !elem_dtype(c.inputs[0].dtype) || c.inputs[0].numel() == 0) return false;
    auto r = pool_geometry(c);
    if (!r.is_ok() || r->global()) return false;   // the global average: cuda.pool_global
    g = r.value();
    const size_t nout = g.max ? 2 : 1;
    if (c.outputs.size() != nout || !c.outputs[0].defined || c.outputs[0].dtype != c.inputs[0].dtype) return false;
    if (g.max && (!c.outputs[1].defined || c.outputs[1].dtype != DType::kI64)) return false;
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
