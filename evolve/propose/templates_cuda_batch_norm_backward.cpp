// CUDA batch norm backward template (cuda.batch_norm_backward): native_batch_norm_backward,
// dense (N, C, *) input, f32 / bf16 / f16 with fp32 accumulation. Part of the CUDA op-family
// templates; shared pieces in templates_cuda_common.h; the geometry follows cuda.batch_norm's.
//
// A channel c is N planes of HxW contiguous elements, C planes apart; (mean, invstd) are the saved
// statistics in training and come from the running ones in eval. When a reduction is needed
// (training, or a grad_weight / grad_bias asked for):
//   1. kc_bnb_reduce: P blocks per channel ("bpc"), each a contiguous slice of the channel's
//      vectors, write its (sum dy, sum dy (x - mean)) into scratch "part";
//   2. kc_bnb_finalize: one block per channel sums its P partials in a fixed order (no atomics:
//      the result is deterministic), writes grad_weight = invstd sum dy (x - mean) and
//      grad_bias = sum dy, and per channel (mean, w invstd, sum dy / M, invstd^2 sum dy xmu / M)
//      into scratch "ss";
// then grad_input, planes x pieces of ITEMS * NT vectors: kc_bnb_apply (training)
// gi = w invstd (dy - mean_dy - (x - mean) k), or kc_bnb_eval gi = dy w invstd.
// Vectors need VEC | HxW so one never straddles two planes; sizes are kernel arguments.
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kBnbBody = R"CU(
__device__ __forceinline__ long long kc_slice(long long TOTV, int P) { return (TOTV + P - 1) / P; }

extern "C" __global__ void __launch_bounds__(NT) kc_bnb_reduce(float* __restrict__ part, const T* __restrict__ dy,
    const T* __restrict__ x KC_STAT_PARAMS, int C, long long HWV, long long TOTV, int P) {
  __shared__ float sh[64];
  const int c = blockIdx.x / P, p = blockIdx.x % P;
  KC_STAT(c, m, is);
  (void)is;
  const long long per = kc_slice(TOTV, P), lo = (long long)p * per, hi = min(TOTV, lo + per);
  float s1 = 0.f, s2 = 0.f;
  for (long long i = lo; i < hi;) {   // one plane segment at a time
    const long long n = i / HWV, j0 = i - n * HWV, j1 = min(HWV, j0 + (hi - i));
    const V* dv = reinterpret_cast<const V*>(dy) + (n * C + c) * HWV;
    const V* xv = reinterpret_cast<const V*>(x) + (n * C + c) * HWV;
    for (long long j = j0 + threadIdx.x; j < j1; j += NT) {
      const V a = dv[j], b = xv[j];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float g = ld(a.v[e]);
        s1 += g;
        s2 = fmaf(g, ld(b.v[e]) - m, s2);
      }
    }
    i += j1 - j0;
  }
  kc_gsum2(s1, s2, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = s1; part[2 * (long long)blockIdx.x + 1] = s2; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_bnb_finalize(float* __restrict__ ss KC_G_PARAMS,
    const float* __restrict__ part KC_WB_PARAMS KC_STAT_PARAMS, long long M, int P) {
  KC_G_LOCALS
  KC_WB_LOCALS
  __shared__ float sh[64];
  const int c = blockIdx.x;
  const float* pr = part + 2 * (long long)c * P;
  float s1 = 0.f, s2 = 0.f;
  for (int p = threadIdx.x; p < P; p += NT) { s1 += pr[2 * p]; s2 += pr[2 * p + 1]; }
  kc_gsum2(s1, s2, sh);
  if (threadIdx.x == 0) {
    KC_STAT(c, m, is);
    const float sx = s2 * is, inv = 1.f / (float)M;   // sum dy xhat
    if (GW) gw[c] = stp(sx);
    if (GB) gb[c] = stp(s1);
    ss[4 * c] = m;
    ss[4 * c + 1] = HAS_W ? is * ldp(w[c]) : is;
    ss[4 * c + 2] = s1 * inv;
    ss[4 * c + 3] = sx * inv * is;
  }
}

// Grid: N * C planes times Q pieces.
extern "C" __global__ void __launch_bounds__(NT) kc_bnb_apply(T* __restrict__ gi, const T* __restrict__ dy,
    const T* __restrict__ x, const float* __restrict__ ss, int C, long long HWV, int Q) {
  const long long plane = blockIdx.x / Q;
  const int q = blockIdx.x % Q, c = (int)(plane % C);
  const float m = ss[4 * c], a = ss[4 * c + 1], md = ss[4 * c + 2], k = ss[4 * c + 3];
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
      for (int e = 0; e < VEC; ++e) o.v[e] = st(a * (ld(d.v[e]) - md - (ld(v.v[e]) - m) * k));
      gv[i] = o;
    }
  }
}

extern "C" __global__ void __launch_bounds__(NT) kc_bnb_eval(T* __restrict__ gi, const T* __restrict__ dy
    KC_WB_PARAMS KC_STAT_PARAMS, int C, long long HWV, int Q) {
  KC_WB_LOCALS
  const long long plane = blockIdx.x / Q;
  const int q = blockIdx.x % Q, c = (int)(plane % C);
  KC_STAT(c, m, is);
  (void)m;
  const float a = HAS_W ? is * ldp(w[c]) : is;
  const V* dv = reinterpret_cast<const V*>(dy) + plane * HWV;
  V* gv = reinterpret_cast<V*>(gi) + plane * HWV;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const long long i = ((long long)q * ITEMS + it) * NT + threadIdx.x;
    if (i < HWV) {
      const V d = dv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(ld(d.v[e]) * a);
      gv[i] = o;
    }
  }
}
)CU";

struct BnbGeom {
  int64_t n = 0, c = 0, hw = 0;
  DType x = DType::kF32, p = DType::kF32;   // input; weight (and eval's running statistics)
  bool train = true, has_w = false, gi = false, gw = false, gb = false;
  bool reduce() const { return train || gw || gb; }
};

bool defined(const TensorMeta* t) { return t && t->defined; }

// The statistics' inputs: fp32 saved ones in training, running ones (the parameter dtype) in eval.
bool stats_ok(const OpCall& c, BnbGeom& g, bool& first) {
  if (g.train) {
    for (const char* nm : {"save_mean", "save_invstd"})
      if (!tensor_ok(c.input(nm), DType::kF32) || c.input(nm)->numel() != g.c) return false;
    return true;
  }
  for (const char* nm : {"running_mean", "running_var"}) {
    const TensorMeta* t = c.input(nm);
    if (!defined(t) || t->numel() != g.c || (t->dtype != g.x && t->dtype != DType::kF32) || (!first && t->dtype != g.p)) return false;
    g.p = t->dtype, first = false;
  }
  return true;
}

// The call's geometry; false when this template does not handle it (grad_weight / grad_bias
// without a weight included: their dtype there is not checked against CUDA's eager).
bool bnb_geometry(const OpCall& c, BnbGeom& g) {
  if (c.backend != BackendKind::kCuda || c.op != OpId::kBatchNormBackward || !c.dense() || c.outputs.size() != 3) return false;
  const TensorMeta* x = c.input("input");
  const TensorMeta* dy = c.input("grad_out");
  if (!defined(x) || !defined(dy) || !elem_dtype(x->dtype) || dy->dtype != x->dtype || dy->sizes != x->sizes) return false;
  if (x->sizes.size() < 2 || x->numel() == 0 || !c.scalar("eps")) return false;
  g.x = g.p = x->dtype;
  g.n = x->sizes[0], g.c = x->sizes[1], g.hw = x->numel() / (g.n * g.c);
  if (g.c > INT_MAX || g.n * g.c > INT_MAX) return false;
  g.train = c.int_arg("train", 1) != 0;
  bool first = true;
  if (const TensorMeta* w = c.input("weight"); defined(w)) {
    if (w->numel() != g.c || (w->dtype != g.x && w->dtype != DType::kF32)) return false;
    g.p = w->dtype, first = false, g.has_w = true;
  }
  if (!stats_ok(c, g, first)) return false;
  g.gi = c.outputs[0].defined, g.gw = c.outputs[1].defined, g.gb = c.outputs[2].defined;
  if (!g.gi && !g.gw && !g.gb) return false;
  if (g.gi && (c.outputs[0].dtype != g.x || c.outputs[0].sizes != x->sizes)) return false;
  for (int i = 1; i < 3; ++i)
    if (c.outputs[i].defined && (!g.has_w || c.outputs[i].dtype != g.p || c.outputs[i].numel() != g.c)) return false;
  return true;
}


std::vector<KnobDim> bnb_space(const BnbGeom& g) {
  std::vector<KnobDim> sp;
  auto vecs = vec_values(g.x, g.hw);
  sp.push_back({"threads", {256, 128, 512, 1024, 64}});
  sp.push_back({"vec", with_default(vecs, vecs.back())});
  if (g.gi) sp.push_back({"items", {4, 1, 2, 8}});
  if (g.reduce()) sp.push_back({"bpc", channel_block_values(g.c, g.n * g.hw / vecs.back())});
  return sp;
}

// Constants, the parameter type, the statistics' source and the optional outputs.
std::string bnb_consts(const BnbGeom& g, const Knobs& k) {
  std::string s = "constexpr int NT = " + S(k.at("threads")) + ", G = NT, VEC = " + S(k.at("vec")) +
                  ", ITEMS = " + S(k.count("items") ? k.at("items") : 1) + ";\n";
  s += affine_prelude(g.p, g.has_w, false);
  s += param_store(g.p);
  if (g.train) {
    s += "#define KC_STAT_PARAMS , const float* __restrict__ sm, const float* __restrict__ si\n"
         "#define KC_STAT(c, m, is) const float m = sm[c], is = si[c]\n";
  } else {   // eager's eval invstd: 1 / sqrt(running_var + eps) in fp32
    s += "#define KC_STAT_PARAMS , const PT* __restrict__ rm, const PT* __restrict__ rv, float eps\n"
         "#define KC_STAT(c, m, is) const float m = ldp(rm[c]), is = 1.f / sqrtf(ldp(rv[c]) + eps)\n";
  }
  return s + grad_wb_params(g.gw, g.gb);
}

class BatchNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.batch_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    BnbGeom g;
    return bnb_geometry(c, g) ? bnb_space(g) : std::vector<KnobDim>{};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    BnbGeom g;
    if (!bnb_geometry(c, g)) return unsupported("cuda.batch_norm_backward does not handle this call");
    auto kr = pick(bnb_space(g), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const int64_t vec = k["vec"], nt = k["threads"], items = k.count("items") ? k["items"] : 1;
    if (g.hw % vec != 0) return unsupported("vec " + S(vec) + " does not divide HxW (" + S(g.hw) + ")");
    if (g.gi && g.n * g.c * cdiv(g.hw / vec, items * nt) > INT_MAX) return unsupported("too many plane pieces for one grid");
    const std::string src = "// kernelcraft cuda.batch_norm_backward " + std::string(dtype_name(g.x)) + " params " +
                            dtype_name(g.p) + (g.train ? " training" : " eval") + "\n" + dtype_prelude(g.x) +
                            bnb_consts(g, k) + kGroupHelpers + kBnbBody;
    auto [ls, scratch] = launches(g, k);
    return make_candidate(name(), std::move(k), src, std::move(ls), std::move(scratch));
  }

 private:
  // The launch list and scratch of a setting; sizes are expressions over the input.
  static std::pair<json, json> launches(const BnbGeom& g, const Knobs& k) {
    const int64_t vec = k.at("vec"), nt = k.at("threads"), items = k.count("items") ? k.at("items") : 1;
    const std::string C = "size(input,1)", HW = "numel(input) / (size(input,0) * size(input,1))";
    const std::string HWV = "(" + HW + ") / " + S(vec), M = "numel(input) / size(input,1)", TOTV = M + " / " + S(vec);
    const std::string Q = "ceil_div(" + HWV + ", " + S(items * nt) + ")", grid = "size(input,0) * size(input,1) * " + Q;
    std::vector<std::string> stat = g.train ? std::vector<std::string>{"ptr:save_mean", "ptr:save_invstd"}
                                            : std::vector<std::string>{"ptr:running_mean", "ptr:running_var", "f32:eps"};
    auto with = [](std::vector<std::string> a, const std::vector<std::string>& more) {
      a.insert(a.end(), more.begin(), more.end());
      return a;
    };
    const std::vector<std::string> w = g.has_w ? std::vector<std::string>{"ptr:weight"} : std::vector<std::string>{};
    json ls = json::array(), scratch;
    if (g.reduce()) {
      const std::string P = S(k.at("bpc"));
      ls.push_back(launch("kc_bnb_reduce", {C + " * " + P}, {nt},
                          with(with({"ptr:part", "ptr:grad_out", "ptr:input"}, stat), {"i32:" + C, "i64:" + HWV, "i64:" + TOTV, "i32:" + P})));
      std::vector<std::string> f = {"ptr:ss"};
      if (g.gw) f.push_back("ptr:out1");
      if (g.gb) f.push_back("ptr:out2");
      f.push_back("ptr:part");
      ls.push_back(launch("kc_bnb_finalize", {C}, {nt}, with(with(with(f, w), stat), {"i64:" + M, "i32:" + P})));
      scratch = json::array({{{"name", "part"}, {"bytes", C + " * " + P + " * 8"}}, {{"name", "ss"}, {"bytes", C + " * 16"}}});
    }
    if (g.gi && g.train) {
      ls.push_back(launch("kc_bnb_apply", {grid}, {nt}, {"ptr:out0", "ptr:grad_out", "ptr:input", "ptr:ss", "i32:" + C, "i64:" + HWV, "i32:" + Q}));
    } else if (g.gi) {
      ls.push_back(launch("kc_bnb_eval", {grid}, {nt}, with(with(with({"ptr:out0", "ptr:grad_out"}, w), stat), {"i32:" + C, "i64:" + HWV, "i32:" + Q})));
    }
    return {ls, scratch};
  }
};

}  // namespace

const Template* cuda_batch_norm_backward_template() {
  static const BatchNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
