// CUDA pooling backward template (cuda.pool_backward): max_pool2d/3d_with_indices_backward,
// avg_pool2d/3d_backward and _adaptive_avg_pool2d/3d_backward over dense tensors, f32 / f16 / bf16
// with fp32 sums. A gather, deterministic and without atomics: each thread owns VPT consecutive
// input elements of one input row (plane, t, h) and sums grad_output over the windows that can
// hold them (pool.h pool_windows_of); max pooling adds only the windows whose saved index is the
// element (eager's CUDA 2d kernel is the same gather), average pooling each term over its window's
// divisor. Overlapping windows (stride < kernel) simply give an element more windows to visit;
// every element is written once. Adjacent threads own adjacent columns, so grad_input stores and
// grad_output / index loads are coalesced along W; `vst` stores a thread's VPT results as one
// vector. 2d is 3d with a one-deep t axis. A call whose tensors are all channels-last (the layout
// of a channels_last network's autograd) takes its own mapping: a thread owns VPT consecutive
// channels of one spatial position, so the window ranges are computed once for all of them and
// grad_output / grad_input move as VPT-wide vectors along C, coalesced across threads.
#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// kc_range: the outputs [lo, hi) whose window (extent ext) can hold input i of n along one axis.
// kc_len: window o's padded and clipped lengths (its count_include_pad and plain divisors).
const char* kWindowFns = R"CU(
__device__ __forceinline__ void kc_range(int i, int n, int on, int s, int p, int ext, int& lo, int& hi) {
  if constexpr (ADAPTIVE) {
    lo = (int)((long long)i * on / n);
    hi = (int)(((long long)(i + 1) * on + n - 1) / n);
  } else {
    lo = i + p < ext ? 0 : (i + p - ext) / s + 1;
    hi = min((i + p) / s + 1, on);
  }
}
__device__ __forceinline__ void kc_len(int o, int n, int on, int s, int p, int k, int& padded, int& clipped) {
  if constexpr (ADAPTIVE) {
    padded = clipped = (int)(((long long)(o + 1) * n + on - 1) / on - (long long)o * n / on);
  } else {
    const int l = o * s - p, h = min(l + k, n + p);
    padded = h - l;
    clipped = min(h, n) - max(l, 0);
  }
}
)CU";

// NCDHW-contiguous: a thread owns VPT consecutive elements of one input row (plane, t, h).
const char* kRowBody = R"CU(
struct alignas(sizeof(T) * VPT) VO { T v[VPT]; };
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ gi, const T* __restrict__ dy, KC_IDX_PARAM
    long long rows, int IT, int IH, int IW, int OT, int OH, int OW, int kT, int kH, int kW, int sT, int sH, int sW,
    int pT, int pH, int pW, int eT, int eH, int eW, int divisor, int include_pad) {
  const long long iwc = (IW + VPT - 1) / VPT, total = rows * iwc;
  const long long step = GS ? (long long)gridDim.x * NT : total;
  for (long long it = (long long)blockIdx.x * NT + threadIdx.x; it < total; it += step) {
    long long row, pt, plane;
    int ic, h, t;
    kc_coords(it, total, iwc, IH, IT, row, pt, plane, ic, h, t);
    const long long ob = plane * ((long long)OT * OH * OW);
    const T* __restrict__ dp = dy + ob;
    KC_IDX_PLANE
    int t0, t1, h0, h1;
    kc_range(t, IT, OT, sT, pT, eT, t0, t1);
    kc_range(h, IH, OH, sH, pH, eH, h0, h1);
    const int w0 = ic * VPT;
    int lo[VPT], hi[VPT];
    float acc[VPT];
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
      kc_range(min(w0 + v, IW - 1), IW, OW, sW, pW, eW, lo[v], hi[v]);
      acc[v] = 0.f;
    }
    const long long self_row = ((long long)t * IH + h) * IW + w0;   // eager's plane-local index
    for (int ot = t0; ot < t1; ++ot) {
      int ptl, ctl;
      kc_len(ot, IT, OT, sT, pT, kT, ptl, ctl);
      for (int oh = h0; oh < h1; ++oh) {
        int phl, chl;
        kc_len(oh, IH, OH, sH, pH, kH, phl, chl);
        const long long rb = ((long long)ot * OH + oh) * OW;
#pragma unroll
        for (int v = 0; v < VPT; ++v)
          for (int ow = lo[v]; ow < hi[v]; ++ow) {
            if constexpr (MAX) {
              if (ip[rb + ow] == self_row + v) acc[v] += ld(dp[rb + ow]);
            } else {
              int pwl, cwl;
              kc_len(ow, IW, OW, sW, pW, kW, pwl, cwl);
              const int cnt = divisor ? divisor : include_pad ? ptl * phl * pwl : ctl * chl * cwl;
              acc[v] += ld(dp[rb + ow]) / (float)cnt;
            }
          }
      }
    }
    const long long gb = row * IW + w0;
    if (VST && w0 + VPT <= IW) {
      VO o;
#pragma unroll
      for (int v = 0; v < VPT; ++v) o.v[v] = st(acc[v]);
      *reinterpret_cast<VO*>(gi + gb) = o;
    } else {
#pragma unroll
      for (int v = 0; v < VPT; ++v)
        if (w0 + v < IW) gi[gb + v] = st(acc[v]);
    }
  }
}
)CU";

// Channels-last: element (n, c, t, h, w) at (((n T + t) H + h) W + w) C + c; VPT divides C.
const char* kChannelsLastBody = R"CU(
struct alignas(sizeof(T) * VPT) VC { T v[VPT]; };
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ gi, const T* __restrict__ dy, KC_IDX_PARAM
    long long npos, int C, int IT, int IH, int IW, int OT, int OH, int OW, int kT, int kH, int kW, int sT, int sH,
    int sW, int pT, int pH, int pW, int eT, int eH, int eW, int divisor, int include_pad) {
  const int cv = C / VPT;
  const long long total = npos * cv;
  const long long step = GS ? (long long)gridDim.x * NT : total;
  for (long long it = (long long)blockIdx.x * NT + threadIdx.x; it < total; it += step) {
    const long long pos = it / cv;
    const int c0 = (int)(it - pos * cv) * VPT;
    long long r = pos / IW;
    const int w = (int)(pos - r * IW);
    const int h = (int)(r % IH);
    r /= IH;
    const int t = (int)(r % IT);
    const long long n = r / IT;
    int t0, t1, h0, h1, w0, w1;
    kc_range(t, IT, OT, sT, pT, eT, t0, t1);
    kc_range(h, IH, OH, sH, pH, eH, h0, h1);
    kc_range(w, IW, OW, sW, pW, eW, w0, w1);
    float acc[VPT];
#pragma unroll
    for (int v = 0; v < VPT; ++v) acc[v] = 0.f;
    const long long self_idx = ((long long)t * IH + h) * IW + w;   // eager's plane-local index
    const long long ob = 0;
    KC_IDX_PLANE
    for (int ot = t0; ot < t1; ++ot) {
      int ptl, ctl;
      kc_len(ot, IT, OT, sT, pT, kT, ptl, ctl);
      for (int oh = h0; oh < h1; ++oh) {
        int phl, chl;
        kc_len(oh, IH, OH, sH, pH, kH, phl, chl);
        for (int ow = w0; ow < w1; ++ow) {
          const long long j = (((n * OT + ot) * OH + oh) * (long long)OW + ow) * C + c0;
          const VC d = *reinterpret_cast<const VC*>(dy + j);
          if constexpr (MAX) {
#pragma unroll
            for (int v = 0; v < VPT; ++v)
              if (ip[j + v] == self_idx) acc[v] += ld(d.v[v]);
          } else {
            int pwl, cwl;
            kc_len(ow, IW, OW, sW, pW, kW, pwl, cwl);
            const int cnt = divisor ? divisor : include_pad ? ptl * phl * pwl : ctl * chl * cwl;
#pragma unroll
            for (int v = 0; v < VPT; ++v) acc[v] += ld(d.v[v]) / (float)cnt;
          }
        }
      }
    }
    VC o;
#pragma unroll
    for (int v = 0; v < VPT; ++v) o.v[v] = st(acc[v]);
    *reinterpret_cast<VC*>(gi + pos * C + c0) = o;
  }
}
)CU";

// True when self is channels-last and every tensor of the call has channels-last strides (pool.h)
// and a 16-byte aligned start.
bool all_channels_last(const OpCall& c) {
  const TensorMeta* x = c.input("self");
  if (!x || !is_channels_last(*x)) return false;
  for (const auto* list : {&c.inputs, &c.outputs})
    for (const auto& t : *list)
      if (t.defined && (!channels_last_strided(t) || t.align < 16)) return false;
  return true;
}

class PoolBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.pool_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    PoolGeom g;
    if (!handles(c, g)) return {};
    if (all_channels_last(c)) {   // channels a thread owns: a vector that divides C
      std::vector<int64_t> vpt;
      for (int64_t v : {1, 2, 4, 8})
        if (c.input("self")->sizes[1] % v == 0 && v * static_cast<int64_t>(dtype_size(c.inputs[0].dtype)) <= 16)
          vpt.push_back(v);
      return {{"threads", {256, 128, 512, 64, 1024}}, {"vpt", with_default(vpt, vpt.back())}, {"gs", {0, 1}}};
    }
    // Input elements a thread owns along W: wider rows amortize the window ranges over more.
    std::vector<int64_t> vpt = {1};
    for (int64_t v : {2, 4}) if (g.in[2] >= v) vpt.push_back(v);
    std::vector<KnobDim> sp = {{"threads", {256, 128, 512, 64, 1024}}, {"vpt", vpt}, {"gs", {0, 1}}};
    if (g.in[2] % 2 == 0) sp.push_back({"vst", {0, 1}});   // vector stores need VPT | W
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.pool_backward does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    PoolGeom g;
    handles(c, g);
    const int64_t nt = k.at("threads"), vpt = k.at("vpt");
    if (vpt == 1 && k.count("vst")) k["vst"] = 0;   // one element: a vector store is a store
    const bool gs = k.at("gs") != 0, vst = k.count("vst") && k.at("vst") != 0;
    if (vst && g.in[2] % vpt != 0) return unsupported("vst needs vpt to divide the row (" + S(g.in[2]) + ")");
    const bool cl = all_channels_last(c);
    const int64_t items = cl ? g.planes * g.in[0] * g.in[1] * g.in[2] / vpt : g.planes * g.in[0] * g.in[1] * cdiv(g.in[2], vpt);
    if (!gs && cdiv(items, nt) > INT_MAX) return unsupported("too many inputs for a grid without grid stride");
    const std::string entry = std::string(g.max ? "kc_max_pool_backward" : g.adaptive ? "kc_adaptive_avg_pool_backward" : "kc_avg_pool_backward") +
                              (cl ? "_cl" : "");
    const DType dt = c.inputs[0].dtype;
    std::string src = "// kernelcraft cuda.pool_backward " + entry + " " + dtype_name(dt) + "\n" + dtype_prelude(dt) +
                      "constexpr int NT = " + S(nt) + ", VPT = " + S(vpt) + ";\nconstexpr bool MAX = " +
                      (g.max ? "true" : "false") + ", ADAPTIVE = " + (g.adaptive ? "true" : "false") +
                      ", GS = " + (gs ? "true" : "false") + ", VST = " + (vst ? "true" : "false") + ";\n" +
                      (g.max ? "#define KC_IDX_PARAM const long long* __restrict__ idx,\n"
                               "#define KC_IDX_PLANE const long long* __restrict__ ip = idx + ob;\n"
                             : "#define KC_IDX_PARAM\n#define KC_IDX_PLANE const long long* ip = nullptr; (void)ip;\n") +
                      kPoolCoords + kWindowFns + with_entry(cl ? kChannelsLastBody : kRowBody, entry);
    std::vector<std::string> args = {"ptr:out0", "ptr:grad_output"};
    if (g.max) args.push_back("ptr:indices");
    const bool d3 = g.nd == 3;
    if (cl) {
      args.push_back("i64:numel(self) / size(self, 1)");
      args.push_back("i32:size(self, 1)");
    } else {
      args.push_back("i64:numel(self) / size(self, -1)");
    }
    for (const char* t : {"self", "grad_output"}) {
      args.push_back(d3 ? "i32:size(" + std::string(t) + ", -3)" : "i32:1");
      args.push_back("i32:size(" + std::string(t) + ", -2)");
      args.push_back("i32:size(" + std::string(t) + ", -1)");
    }
    // The window lists, resolved per axis at render time (the spec cannot index a list scalar);
    // the extent is the dilated one for max pooling.
    for (const int64_t* v : {g.k, g.s, g.p})
      for (int a = 0; a < 3; ++a) args.push_back("i32:" + S(v[a]));
    for (int a = 0; a < 3; ++a) args.push_back("i32:" + S(g.max ? (g.k[a] - 1) * g.d[a] + 1 : g.k[a]));
    args.push_back("i32:" + S(g.divisor));
    args.push_back(std::string("i32:") + (g.count_include_pad || g.adaptive ? "1" : "0"));
    const std::string its = cl ? "numel(self) / " + S(vpt)
                               : "(numel(self) / size(self, -1)) * ceil_div(size(self, -1), " + S(vpt) + ")";
    const std::string grid = gs ? "min(ceil_div(" + its + ", " + S(nt) + "), " + S(kSms * (2048 / nt)) + ")"
                                : "ceil_div(" + its + ", " + S(nt) + ")";
    return make_candidate(name(), k, std::move(src), json::array({launch(entry, {grid}, {nt}, args)}));
  }

 private:
  static bool handles(const OpCall& c, PoolGeom& g) {
    if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kPoolBackward) return false;
    if (!c.dense() && !all_channels_last(c)) return false;
    const TensorMeta* x = c.input("self");
    const TensorMeta* dy = c.input("grad_output");
    if (!x || !dy || !x->defined || !elem_dtype(x->dtype) || dy->dtype != x->dtype || x->numel() == 0) return false;
    auto r = pool_geometry(c);
    if (!r.is_ok()) return false;
    g = r.value();
    if (c.outputs.size() != 1 || !c.outputs[0].defined || c.outputs[0].dtype != x->dtype) return false;
    // Window arithmetic is int: o * s + (k - 1) * d + p, i * out and a window's size must fit.
    for (int a = 0; a < 3; ++a)
      if (g.out[a] * g.s[a] + g.k[a] * g.d[a] + g.in[a] + g.p[a] > INT_MAX) return false;
    if (g.k[0] * g.k[1] * g.k[2] > INT_MAX) return false;
    return g.divisor >= INT_MIN && g.divisor <= INT_MAX;
  }
};

}  // namespace

const Template* cuda_pool_backward_template() {
  static const PoolBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
