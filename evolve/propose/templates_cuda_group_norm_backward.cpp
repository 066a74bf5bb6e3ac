// CUDA group norm backward template (cuda.group_norm_backward): native_group_norm_backward,
// dense (N, C, *) input, f32 / bf16 / f16 with fp32 accumulation. Part of the CUDA op-family
// templates; shared pieces in templates_cuda_common.h; the structure follows
// cuda.batch_norm_backward's.
//
// A row (n, g) is D = C / group channel planes of HxW contiguous elements, normalized with its
// saved mean and rstd. Three launches, no atomics (every sum has a fixed order, so results are
// deterministic):
//   1. kc_gnb_reduce: P blocks per plane ("bpp"), each a contiguous slice of the plane's vectors,
//      write its (sum dy, sum dy (x - mean)) into scratch "part" (UNROLL vector pairs in flight
//      per thread);
//   2. kc_gnb_finalize, two kinds of block: one per row sums its D x P partials weighted by
//      w[c] and writes (mean, rstd, rstd sum w dy (x - mean) / K, sum w dy / K), K = D x HxW,
//      into scratch "ss"; one per channel sums its N planes' partials in order of n and writes
//      grad_bias = sum dy and grad_weight = sum_n rstd sum dy (x - mean);
//   3. kc_gnb_apply, planes x pieces of ITEMS * NT vectors:
//      gi = rstd (w dy - sum w dy / K - xhat k), xhat = (x - mean) rstd; with "rev" the pieces run
//      in reverse plane order, so the planes launch 1 read last are still in L2 when launch 3
//      starts.
// The centred sum dy (x - mean) stays exact where eager's sum dy x - mean sum dy cancels (inputs
// far from zero). Launches 1 and 3 each read x and dy once: 5 tensor passes in all (eager's
// minimum is 3: a fused single pass would need a grid-wide barrier per row).
// Vectors need VEC | HxW so one never straddles two planes; sizes are kernel arguments.
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kGnbBody = R"CU(
extern "C" __global__ void __launch_bounds__(NT) kc_gnb_reduce(float* __restrict__ part, const T* __restrict__ dy,
    const T* __restrict__ x, const ST* __restrict__ mean, int CPG, long long HWV, int P) {
  __shared__ float sh[64];
  const long long plane = blockIdx.x / P;
  const int p = blockIdx.x % P;
  const float m = lds(mean[plane / CPG]);   // row n * group + c / CPG, since C = group * CPG
  const long long per = (HWV + P - 1) / P, lo = (long long)p * per, hi = min(HWV, lo + per);
  const V* dv = reinterpret_cast<const V*>(dy) + plane * HWV;
  const V* xv = reinterpret_cast<const V*>(x) + plane * HWV;
  float s1 = 0.f, s2 = 0.f;
  long long j = lo + threadIdx.x;
  for (; j + (UNROLL - 1) * NT < hi; j += UNROLL * NT) {   // all loads of a step issued first
    V a[UNROLL], b[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) { a[u] = dv[j + u * NT]; b[u] = xv[j + u * NT]; }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float g = ld(a[u].v[e]);
        s1 += g;
        s2 = fmaf(g, ld(b[u].v[e]) - m, s2);
      }
  }
  for (; j < hi; j += NT) {
    const V a = dv[j], b = xv[j];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float g = ld(a.v[e]);
      s1 += g;
      s2 = fmaf(g, ld(b.v[e]) - m, s2);
    }
  }
  kc_gsum2(s1, s2, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = s1; part[2 * (long long)blockIdx.x + 1] = s2; }
}

// The sums of plane pl over its P partials, in order.
__device__ __forceinline__ void kc_plane(const float* __restrict__ part, long long pl, int P, float& d, float& s) {
  const float* pr = part + 2 * pl * P;
  d = 0.f, s = 0.f;
  for (int q = 0; q < P; ++q) { d += pr[2 * q]; s += pr[2 * q + 1]; }
}

// Grid: ROWS row blocks (0 when grad_input is not asked for), then C channel blocks (when
// grad_weight or grad_bias is).
extern "C" __global__ void __launch_bounds__(NT) kc_gnb_finalize(float* __restrict__ ss KC_G_PARAMS,
    const float* __restrict__ part KC_WB_PARAMS, const ST* __restrict__ mean, const ST* __restrict__ rstd, int N, int C,
    int CPG, int P, int ROWS, long long K) {
  KC_G_LOCALS
  KC_WB_LOCALS
  __shared__ float sh[64];
  const int GROUPS = C / CPG;
  float s1 = 0.f, s2 = 0.f;
  if ((int)blockIdx.x < ROWS) {
    const int row = blockIdx.x, c0 = (row % GROUPS) * CPG;
    for (int i = threadIdx.x; i < CPG; i += NT) {
      float d, s;
      kc_plane(part, (long long)row * CPG + i, P, d, s);
      const float wc = HAS_W ? ldp(w[c0 + i]) : 1.f;
      s1 = fmaf(wc, d, s1);
      s2 = fmaf(wc, s, s2);
    }
    kc_gsum2(s1, s2, sh);
    if (threadIdx.x == 0) {
      const float rs = lds(rstd[row]), inv = 1.f / (float)K;
      ss[4 * row] = lds(mean[row]);
      ss[4 * row + 1] = rs;
      ss[4 * row + 2] = rs * s2 * inv;
      ss[4 * row + 3] = s1 * inv;
    }
    return;
  }
  const int c = blockIdx.x - ROWS, g = c / CPG;
  for (int n = threadIdx.x; n < N; n += NT) {
    float d, s;
    kc_plane(part, (long long)n * C + c, P, d, s);
    s1 += d;
    s2 = fmaf(lds(rstd[(long long)n * GROUPS + g]), s, s2);
  }
  kc_gsum2(s1, s2, sh);
  if (threadIdx.x == 0) {
    if (GW) gw[c] = stp(s2);
    if (GB) gb[c] = stp(s1);
  }
}

// Grid: NB = N * C planes times Q pieces.
extern "C" __global__ void __launch_bounds__(NT) kc_gnb_apply(T* __restrict__ gi, const T* __restrict__ dy,
    const T* __restrict__ x, const float* __restrict__ ss KC_WB_PARAMS, int C, int CPG, long long HWV, int Q, long long NB) {
  KC_WB_LOCALS
  const long long blk = REV ? NB - 1 - (long long)blockIdx.x : (long long)blockIdx.x;
  const long long plane = blk / Q, row = plane / CPG;
  const int q = (int)(blk % Q), c = (int)(plane % C);
  const float m = ss[4 * row], rs = ss[4 * row + 1], k = ss[4 * row + 2], md = ss[4 * row + 3];
  const float wc = HAS_W ? ldp(w[c]) : 1.f;
  const V* dv = reinterpret_cast<const V*>(dy) + plane * HWV;
  const V* xv = reinterpret_cast<const V*>(x) + plane * HWV;
  V* gv = reinterpret_cast<V*>(gi) + plane * HWV;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const long long i = ((long long)q * ITEMS + it) * NT + threadIdx.x;
    if (i < HWV) {
      const V d = dv[i], v = xv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(rs * (wc * ld(d.v[e]) - md - (ld(v.v[e]) - m) * rs * k));
      gv[i] = o;
    }
  }
}
)CU";

struct GnbGeom {
  int64_t n = 0, c = 0, hw = 0, group = 0;
  DType x = DType::kF32, p = DType::kF32, s = DType::kF32;   // input; weight; mean and rstd
  bool has_w = false, gi = false, gw = false, gb = false;
};

bool defined(const TensorMeta* t) { return t && t->defined; }

// The call's geometry; false when this template does not handle it. mean / rstd and the weight
// are the input's dtype or fp32 (the mixed call: CUDA eager may refuse it, and then so does the
// gauntlet).
bool gnb_geometry(const OpCall& c, GnbGeom& g) {
  if (c.backend != BackendKind::kCuda || c.op != OpId::kGroupNormBackward || !c.dense() || c.outputs.size() != 3) return false;
  const TensorMeta* x = c.input("input");
  const TensorMeta* dy = c.input("grad_out");
  if (!defined(x) || !defined(dy) || !elem_dtype(x->dtype) || dy->dtype != x->dtype || dy->sizes != x->sizes) return false;
  g.n = c.int_arg("N", 0), g.c = c.int_arg("C", 0), g.hw = c.int_arg("HxW", 0), g.group = c.int_arg("group", 0);
  if (g.n <= 0 || g.c <= 0 || g.hw <= 0 || g.group <= 0 || g.c % g.group != 0 || g.n * g.c * g.hw != x->numel()) return false;
  if (g.n * g.c > INT_MAX) return false;
  g.x = g.p = x->dtype;
  const TensorMeta* m = c.input("mean");
  const TensorMeta* r = c.input("rstd");
  if (!defined(m) || !defined(r) || m->dtype != r->dtype || (m->dtype != g.x && m->dtype != DType::kF32)) return false;
  if (m->numel() != g.n * g.group || r->numel() != g.n * g.group) return false;
  g.s = m->dtype;
  if (const TensorMeta* w = c.input("weight"); defined(w)) {
    if (w->numel() != g.c || (w->dtype != g.x && w->dtype != DType::kF32)) return false;
    g.p = w->dtype, g.has_w = true;
  }
  g.gi = c.outputs[0].defined, g.gw = c.outputs[1].defined, g.gb = c.outputs[2].defined;
  if (!g.gi && !g.gw && !g.gb) return false;
  if (g.gi && (c.outputs[0].dtype != g.x || c.outputs[0].sizes != x->sizes)) return false;
  for (int i = 1; i < 3; ++i)
    if (c.outputs[i].defined && (!g.has_w || c.outputs[i].dtype != g.p || c.outputs[i].numel() != g.c)) return false;
  return true;
}

std::vector<KnobDim> gnb_space(const GnbGeom& g) {
  std::vector<KnobDim> sp;
  auto vecs = vec_values(g.x, g.hw);
  sp.push_back({"threads", {256, 128, 512, 1024, 64, 32}});
  sp.push_back({"vec", with_default(vecs, vecs.back())});
  sp.push_back({"unroll", {4, 1, 2, 8}});
  sp.push_back({"bpp", channel_block_values(g.n * g.c, g.hw / vecs.back())});
  if (g.gi) {
    sp.push_back({"items", {4, 1, 2, 8}});
    sp.push_back({"rev", {1, 0}});
  }
  return sp;
}

// Constants, the parameter and statistics types and the optional outputs.
std::string gnb_consts(const GnbGeom& g, const Knobs& k) {
  std::string s = "constexpr int NT = " + S(k.at("threads")) + ", G = NT, VEC = " + S(k.at("vec")) +
                  ", UNROLL = " + S(k.at("unroll")) + ", ITEMS = " + S(k.count("items") ? k.at("items") : 1) + ";\n";
  s += std::string("constexpr bool REV = ") + (k.count("rev") && k.at("rev") ? "true" : "false") + ";\n";
  s += affine_prelude(g.p, g.has_w, false) + param_store(g.p);
  s += std::string("typedef ") + ctype(g.s) + " ST;\n";
  s += g.s == DType::kF32 ? "__device__ __forceinline__ float lds(ST v) { return v; }\n"
                          : "__device__ __forceinline__ float lds(ST v) { return ld(v); }\n";
  return s + grad_wb_params(g.gw, g.gb);
}

class GroupNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.group_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    GnbGeom g;
    return gnb_geometry(c, g) ? gnb_space(g) : std::vector<KnobDim>{};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    GnbGeom g;
    if (!gnb_geometry(c, g)) return unsupported("cuda.group_norm_backward does not handle this call");
    auto kr = pick(gnb_space(g), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const int64_t vec = k["vec"], nt = k["threads"], items = k.count("items") ? k["items"] : 1;
    if (g.hw % vec != 0) return unsupported("vec " + S(vec) + " does not divide HxW (" + S(g.hw) + ")");
    if (g.gi && g.n * g.c * cdiv(g.hw / vec, items * nt) > INT_MAX) return unsupported("too many plane pieces for one grid");
    const std::string src = "// kernelcraft cuda.group_norm_backward " + std::string(dtype_name(g.x)) + " params " +
                            dtype_name(g.p) + " stats " + dtype_name(g.s) + "\n" + dtype_prelude(g.x) +
                            gnb_consts(g, k) + kGroupHelpers + kGnbBody;
    auto [ls, scratch] = launches(g, k);
    return make_candidate(name(), std::move(k), src, std::move(ls), std::move(scratch));
  }

 private:
  // The launch list and scratch of a setting; sizes are expressions over the call's scalars.
  static std::pair<json, json> launches(const GnbGeom& g, const Knobs& k) {
    const int64_t vec = k.at("vec"), nt = k.at("threads"), items = k.count("items") ? k.at("items") : 1;
    const std::string P = S(k.at("bpp")), HWV = "HxW / " + S(vec), planes = "N * C", rows = "N * group";
    const std::vector<std::string> w = g.has_w ? std::vector<std::string>{"ptr:weight"} : std::vector<std::string>{};
    auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
      a.insert(a.end(), more.begin(), more.end());
      return a;
    };
    json ls = json::array();
    ls.push_back(launch("kc_gnb_reduce", {planes + " * " + P}, {nt},
                        {"ptr:part", "ptr:grad_out", "ptr:input", "ptr:mean", "i32:C / group", "i64:" + HWV, "i32:" + P}));
    std::vector<std::string> f = {"ptr:ss"};
    if (g.gw) f.push_back("ptr:out1");
    if (g.gb) f.push_back("ptr:out2");
    f.push_back("ptr:part");
    const std::string R = g.gi ? rows : "0", grid = g.gi ? (g.gw || g.gb ? rows + " + C" : rows) : "C";
    ls.push_back(launch("kc_gnb_finalize", {grid}, {nt},
                        with(with(f, w), {"ptr:mean", "ptr:rstd", "i32:N", "i32:C", "i32:C / group", "i32:" + P, "i32:" + R,
                                          "i64:C / group * HxW"})));
    if (g.gi) {
      const std::string Q = "ceil_div(" + HWV + ", " + S(items * nt) + ")", nb = planes + " * " + Q;
      ls.push_back(launch("kc_gnb_apply", {nb}, {nt},
                          with(with({"ptr:out0", "ptr:grad_out", "ptr:input", "ptr:ss"}, w),
                               {"i32:C", "i32:C / group", "i64:" + HWV, "i32:" + Q, "i64:" + nb})));
    }
    json scratch = json::array({{{"name", "part"}, {"bytes", planes + " * " + P + " * 8"}},
                                {{"name", "ss"}, {"bytes", rows + " * 16"}}});
    return {ls, scratch};
  }
};

}  // namespace

const Template* cuda_group_norm_backward_template() {
  static const GroupNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
