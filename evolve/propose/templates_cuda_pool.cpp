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
// The kernels' device sources: templates_cuda_pool_kernels.cpp and templates_cuda_pool_strip.cpp;
// this file holds the knobs and the render.
#include <set>

#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_pool.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// Registers the REGS row span may take (floats a thread).
constexpr int64_t kMaxSpan = 32;

// Adaptive windows vary in length, and a window of more taps than this would unroll into a
// kernel slow to compile for little gain (its loop overhead is already amortized): those calls
// get the runtime kernel only.
constexpr int64_t kMaxBakedTaps = 64;
bool bakeable(const PoolGeom& g) { return !g.adaptive && g.k[0] * g.k[1] * g.k[2] <= kMaxBakedTaps; }

// The input columns one row of VPT consecutive windows covers along W.
int64_t row_span(const PoolGeom& g, int64_t vpt) { return (vpt - 1) * g.s[2] + (g.k[2] - 1) * g.d[2] + 1; }

// A register span read in vectors of vl elements (kc_span): it starts off = (-PW) mod vl columns
// before a thread's first (vl-aligned, as vpt * SW is a multiple of vl) and takes nspan registers.
struct SpanLayout {
  int64_t off, nspan;
};
SpanLayout span_layout(const PoolGeom& g, int64_t vpt, int64_t vl) {
  const int64_t off = (vl - g.p[2] % vl) % vl;
  return {off, (off + row_span(g, vpt) + vl - 1) / vl * vl};
}

// The static shared memory of kc_stage (knob `stage`): a warp's 32 x vpt values padded by one a
// row of 32, its lanes' output offsets and counts, and the indices where the op has them.
int64_t stage_bytes(const PoolGeom& g, int64_t nt, int64_t vpt) {
  const int64_t w = 32 * vpt;
  return nt / 32 * ((w + w / 32) * 4 + 32 * 12 + (g.indices ? w * 8 : 0));
}

// Whether a register-span seed of vpt outputs a thread stores through shared memory. On an H100
// (2026-12-06; dilated max_pool1d k8 (64, 192, 16384) fp32 / bf16, 4x4 stride-1 max pooling bf16,
// 3x3 stride-1 avg pooling bf16 of (16, 32|64, 256, 256)) staging 8 outputs a thread ran 1.35-2.4x
// faster in three of the four and 4% slower in the fourth; staging 4 ran 9-25% slower in all six
// pairs (fp32 and bf16), the exchange costing more than the coalesced stores saved.
int64_t staged(int64_t vpt) { return vpt >= 8 ? 1 : 0; }

// Whether a thread's span of vpt outputs starts vl-aligned: its first column moves by vpt * SW.
bool span_aligned(const PoolGeom& g, int64_t vpt, int64_t vl) { return (vpt * g.s[2]) % vl == 0; }

// The widest vector of the input's row that a thread of vpt outputs starts aligned on (1: none).
int64_t widest_aligned(const OpCall& c, const PoolGeom& g, int64_t vpt) {
  int64_t vl = 1;
  for (int64_t v : vec_values(c.inputs[0].dtype, g.in[2]))
    if (span_aligned(g, vpt, v)) vl = v;
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
    // A register span is also offered where vector loads can fill it (`vl`, see kc_span in templates_cuda_pool_kernels.cpp): a
    // stride-2 window of 2 then reads its row's span in one 16-byte load per VPT outputs.
    // The vector lengths dividing the input row (every row then starts aligned), up to 16 bytes.
    const std::vector<int64_t> vls = vec_values(c.inputs[0].dtype, g.in[2]);
    const bool regs = g.s[2] < row_span(g, 1) || vls.size() > 1;
    sp.push_back({"regs", regs ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0}});
    if (vls.size() > 1) sp.push_back({"vl", vls});
    if (rows.size() > 1) sp.push_back({"rows", with_default(rows, strip ? 4 : 1)});
    // Consecutive outputs a thread (il 0) stored through shared memory (kc_stage): register spans
    // need il 0, and their scattered stores otherwise bound them (templates_cuda_pool_kernels.cpp).
    sp.push_back({"stage", {0, 1}});
    // Or stored as vectors where a lane's outputs start aligned (kc_put; no exchange).
    sp.push_back({"vst", {0, 1}});
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
    Knobs k = {{"bake", 1}, {"regs", 1}, {"il", 0}, {"vpt", vpt}, {"vl", vl}, {"stage", staged(vpt)}};
    std::vector<Knobs> out = {k};
    // Loads an output as a fraction nspan / (vl * v), compared by cross-multiplying.
    int64_t best_v = vpt, best_vl = vl, best_n = span_layout(g, vpt, vl).nspan;
    bool fits = best_n <= kMaxSpan;
    for (int64_t v : {2, 4, 8})
      for (int64_t w : vec_values(c.inputs[0].dtype, g.in[2])) {
        const int64_t n = span_layout(g, v, w).nspan;
        if (v > g.out[2] || w == 1 || !span_aligned(g, v, w) || n > kMaxSpan) continue;
        if (!fits || n * best_vl * best_v < best_n * w * v) best_v = v, best_vl = w, best_n = n, fits = true;
      }
    if (fits && (best_v != vpt || best_vl != vl))
      out.push_back({{"bake", 1}, {"regs", 1}, {"il", 0}, {"vpt", best_v}, {"vl", best_vl}, {"stage", staged(best_v)}});
    const size_t spans = out.size();
    // Single output rows where strips are offered (else that is the first seed again).
    for (const KnobDim& d : space(c))
      if (d.name == "rows") {
        Knobs single = k;
        single["rows"] = 1;
        out.push_back(single);
      }
    // Each span seed's outputs stored as aligned vectors instead (vst, no exchange): last, so a
    // short search keeps the seeds above. On an H100 (2026-12-06) vst against the best of staged
    // and plain stores: the dilated 1x8 max_pool1d of (64,192,16384), 8 outputs a thread, fp32
    // 0.587 ms against 0.668 staged (0.567 at 128 threads); bf16 0.972 against 0.798 staged. bf16
    // avg_pool2d 3x3 stride 1 in strips 0.264 against 0.291; fp32 the same (0.275).
    for (size_t i = 0; i < spans; ++i) {
      Knobs v = out[i];
      v["stage"] = 0;
      v["vst"] = 1;
      out.push_back(v);
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
    if (k.count("stage") && (!bake || k.at("vpt") == 1 || k.at("il"))) k["stage"] = 0;
    if (k.count("vst") && (!bake || k.at("vpt") == 1 || k.at("il") || k.at("stage"))) k["vst"] = 0;
    const int64_t nt = k.at("threads"), vpt = k.at("vpt"), rows = k.count("rows") ? k.at("rows") : 1;
    const int64_t vl = k.count("vl") ? k.at("vl") : 1;
    if (!span_aligned(g, vpt, vl))
      return unsupported("vectors of " + S(vl) + " do not start aligned when a thread's outputs span " + S(vpt * g.s[2]));
    const int64_t nspan = span_layout(g, vpt, vl).nspan;
    if (bake && k.at("regs") && nspan > kMaxSpan)
      return unsupported("a row span of " + S(nspan) + " inputs does not fit the registers");
    if (k.count("stage") && k.at("stage") && stage_bytes(g, nt, vpt) > kMaxStaticShared)
      return unsupported("staging " + S(nt) + " threads' outputs needs " + S(stage_bytes(g, nt, vpt)) + " bytes of shared memory");
    const bool gs = k.at("gs") != 0, mx = g.max;
    const int64_t items = g.planes * g.out[0] * cdiv(g.out[1], rows) * cdiv(g.out[2], vpt);
    if (!gs && cdiv(items, nt) > INT_MAX) return unsupported("too many outputs for a grid without grid stride");
    const std::string entry = mx ? "kc_max_pool" : g.adaptive ? "kc_adaptive_avg_pool" : "kc_avg_pool";
    const DType dt = c.inputs[0].dtype;
    std::string src = "// kernelcraft cuda.pool " + entry + " " + dtype_name(dt) + "\n" + dtype_prelude(dt) +
                      "constexpr int NT = " + S(nt) + ", VPT = " + S(vpt) + ";\nconstexpr bool MAX = " +
                      (mx ? "true" : "false") + ", GS = " + (gs ? "true" : "false") + ";\n" +
                      (bake ? baked_consts(g, k) : "") + (rows > 1 ? "constexpr int ROWS = " + S(rows) + ";\n" : "") +
                      (g.indices ? "constexpr bool IDX = true;\n#define KC_IDX_PARAM long long* __restrict__ idx,\n"
                                   "#define KC_IDX_ARG idx,\n#define KC_IDX_STORE(i, v) idx[i] = v\n"
                                 : "constexpr bool IDX = false;\n#define KC_IDX_PARAM\n#define KC_IDX_ARG\n#define KC_IDX_STORE(i, v)\n") +
                      kPoolCoords + pool_window(g.adaptive) + (bake ? pool_baked_helpers() : "") +
                      with_entry(rows > 1 ? pool_strip_kernel() : bake ? pool_baked_kernel() : pool_runtime_kernel(), entry);
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
           ", STAGE = " + (k.count("stage") && k.at("stage") ? "true" : "false") +
           ", VST = " + (k.count("vst") && k.at("vst") ? "true" : "false") +
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
        if (v == g.s && g.adaptive)   // the output size in the stride's slot (pool_window)
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
