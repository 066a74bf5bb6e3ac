// CUDA loss template (cuda.loss): mse_loss, smooth_l1_loss, huber_loss, binary_cross_entropy,
// binary_cross_entropy_with_logits (weight and pos_weight of self's sizes or a suffix broadcast
// of them, [C]), nll_loss_forward and nll_loss2d_forward over dense tensors, f32 / f16 / bf16,
// fp32 math.
//
// Reduction none is one elementwise pass (kc_loss_map: VEC-wide loads, UNROLL vectors a thread a
// round; nll gathers self at each target). Mean and sum are where eager is slow: it writes the
// elementwise loss and reduces it in a second pass over memory, while here every term is summed
// as it is computed. A fused, deterministic two-stage reduction (knob "blocks" = P): P blocks
// grid-stride over the terms, each thread sums its terms in fp32 in a fixed order, each block
// folds its threads in a fixed order (kc_gsum) into part[block]; a one-block launch then folds the
// P partials in a fixed order and writes the result. No atomics: the bits depend only on the knobs.
// P = 1 is a single launch that writes the result itself (small calls). nll sums the weighted
// terms and the total weight side by side; mean divides them as eager does (0 / 0 = nan when every
// target is ignored). A target that is neither ignore_index nor a class makes the result NaN
// (eager raises; a kernel cannot, and must not read outside self).
#include "evolve/ops/loss.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// One term in fp32, as eager forms it (bce: logs clamped at -100 with std::max's NaN behaviour).
const char* kTermFn = R"CU(
__device__ __forceinline__ float kc_term(float x, float t, float w, float p) {
  float v;
  if constexpr (KIND == 0) {
    const float d = x - t;
    v = d * d;
  } else if constexpr (KIND == 1) {
    const float z = fabsf(x - t);
    v = z < p ? 0.5f * z * z / p : z - 0.5f * p;
  } else if constexpr (KIND == 2) {
    const float z = fabsf(x - t);
    v = z < p ? 0.5f * z * z : p * (z - 0.5f * p);
  } else {
    float lx = logf(x), l1 = log1pf(-x);
    lx = lx < -100.f ? -100.f : lx;
    l1 = l1 < -100.f ? -100.f : l1;
    v = (t - 1.f) * l1 - t * lx;
  }
  if constexpr (HAS_W) v *= w;
  return v;
}
)CU";

// Elementwise losses. kc_each(i0, fn) visits this thread's vectors i of [0, n / VEC) and the tail
// elements [n / VEC * VEC, n) (block 0), in a fixed order; fn(index of the first element, count).
const char* kEachLoad = R"CU(
template <class F> __device__ __forceinline__ void kc_each(long long n, F fn) {
  const long long nv = n / VEC, step = (long long)gridDim.x * NT * UNROLL;
  for (long long i = (long long)blockIdx.x * NT * UNROLL + threadIdx.x; i < nv; i += step) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv) fn((i + u * NT) * VEC, VEC);
  }
  if (blockIdx.x == 0)
    for (long long k = nv * VEC + threadIdx.x; k < n; k += NT) fn(k, 1);
}
__device__ __forceinline__ void kc_load(const T* __restrict__ p, long long i, int cnt, float* f) {
  if (cnt == VEC) {
    const V v = *reinterpret_cast<const V*>(p + i);
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] = ld(v.v[e]);
  } else {
    f[0] = ld(p[i]);
  }
}
)CU";
// The terms of mse, smooth l1, huber and bce (kc_term), and their partial sums: part[block], or
// with P == 1 the result itself.
const char* kLossKernels = R"CU(extern "C" __global__ void __launch_bounds__(NT) kc_loss_map(T* __restrict__ out, const T* __restrict__ x,
    const T* __restrict__ t KC_W_PARAM, long long n, float p) {
  KC_W_LOCAL
  kc_each(n, [&](long long i, int cnt) {
    float xf[VEC], tf[VEC], wf[VEC];
    kc_load(x, i, cnt, xf);
    kc_load(t, i, cnt, tf);
    if constexpr (HAS_W) kc_load(w, i, cnt, wf);
    if (cnt == VEC) {
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_term(xf[e], tf[e], HAS_W ? wf[e] : 1.f, p));
      *reinterpret_cast<V*>(out + i) = o;
    } else {
      out[i] = st(kc_term(xf[0], tf[0], HAS_W ? wf[0] : 1.f, p));
    }
  });
}
// Partial sums of the terms: part[block], or with P == 1 the result itself.
extern "C" __global__ void __launch_bounds__(NT) kc_loss_part(float* __restrict__ part, T* __restrict__ out,
    const T* __restrict__ x, const T* __restrict__ t KC_W_PARAM, long long n, float p) {
  KC_W_LOCAL
  __shared__ float sh[64];
  float acc = 0.f;
  kc_each(n, [&](long long i, int cnt) {
    float xf[VEC], tf[VEC], wf[VEC];
    kc_load(x, i, cnt, xf);
    kc_load(t, i, cnt, tf);
    if constexpr (HAS_W) kc_load(w, i, cnt, wf);
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      if (e < cnt) acc += kc_term(xf[e], tf[e], HAS_W ? wf[e] : 1.f, p);
  });
  acc = kc_gsum(acc, sh);
  if (threadIdx.x != 0) return;
  if constexpr (SINGLE) out[0] = st(MEAN ? (float)((double)acc / (double)n) : acc);
  else part[blockIdx.x] = acc;
}
)CU";
// The P partials folded in a fixed order (every elementwise loss).
const char* kLossFinal = R"CU(extern "C" __global__ void __launch_bounds__(NT) kc_loss_final(T* __restrict__ out, const float* __restrict__ part,
                                                               int P, long long n) {
  __shared__ float sh[64];
  float acc = 0.f;
  for (int i = threadIdx.x; i < P; i += NT) acc += part[i];
  acc = kc_gsum(acc, sh);
  if (threadIdx.x == 0) out[0] = st(MEAN ? (float)((double)acc / (double)n) : acc);
}
)CU";

// bce with logits in fp32, in eager's order (ATen's Loss.cpp and log_sigmoid): ls = min(x, 0) -
// log1p(exp(-|x|)), times lw = (p - 1) t + 1 with pos_weight, v = (1 - t) x - ls, times weight;
// an infinite logit gives eager's inf or NaN (0 * inf, inf - inf). A parameter (weight,
// pos_weight) of MODE 0 is one element for every term, 1 self's sizes, 2 a suffix broadcast of M
// elements (loss.h LossGeom::w_mod) read at i % M, a constant modulus (32-bit where every index
// fits); M % VEC == 0 there (the vec knob), so a vector of terms reads a vector of the parameter.
const char* kLogitsBody = R"CU(
__device__ __forceinline__ float kc_logit(float x, float t, float w, float pw) {
  float ls = fminf(x, 0.f) - log1pf(expf(-fabsf(x)));
  if constexpr (HAS_P) ls *= (pw - 1.f) * t + 1.f;
  const float v = (1.f - t) * x - ls;
  return HAS_W ? v * w : v;
}
template <int MODE, unsigned long long M>
__device__ __forceinline__ void kc_param(const T* __restrict__ p, long long i, int cnt, float* f) {
  if constexpr (MODE == 0) {
    const float s = ld(p[0]);
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] = s;
  } else if constexpr (MODE == 1) {
    kc_load(p, i, cnt, f);
  } else {
    const long long j = IDX32 ? (long long)((unsigned)i % (unsigned)M) : (long long)((unsigned long long)i % M);
    kc_load(p, j, cnt, f);
  }
}
__device__ __forceinline__ void kc_logits(const T* __restrict__ x, const T* __restrict__ t, const T* w, const T* pw,
                                          long long i, int cnt, float* v) {
  float xf[VEC], tf[VEC], wf[VEC], pf[VEC];
  kc_load(x, i, cnt, xf);
  kc_load(t, i, cnt, tf);
  if constexpr (HAS_W) kc_param<WMODE, WMOD>(w, i, cnt, wf);
  if constexpr (HAS_P) kc_param<PMODE, PMOD>(pw, i, cnt, pf);
#pragma unroll
  for (int e = 0; e < VEC; ++e)
    if (e < cnt) v[e] = kc_logit(xf[e], tf[e], HAS_W ? wf[e] : 1.f, HAS_P ? pf[e] : 1.f);
}
extern "C" __global__ void __launch_bounds__(NT) kc_logits_map(T* __restrict__ out, const T* __restrict__ x,
    const T* __restrict__ t KC_W_PARAM KC_P_PARAM, long long n) {
  KC_W_LOCAL KC_P_LOCAL
  kc_each(n, [&](long long i, int cnt) {
    float v[VEC];
    kc_logits(x, t, w, pw, i, cnt, v);
    if (cnt == VEC) {
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(v[e]);
      *reinterpret_cast<V*>(out + i) = o;
    } else {
      out[i] = st(v[0]);
    }
  });
}
extern "C" __global__ void __launch_bounds__(NT) kc_logits_part(float* __restrict__ part, T* __restrict__ out,
    const T* __restrict__ x, const T* __restrict__ t KC_W_PARAM KC_P_PARAM, long long n) {
  KC_W_LOCAL KC_P_LOCAL
  __shared__ float sh[64];
  float acc = 0.f;
  kc_each(n, [&](long long i, int cnt) {
    float v[VEC];
    kc_logits(x, t, w, pw, i, cnt, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      if (e < cnt) acc += v[e];
  });
  acc = kc_gsum(acc, sh);
  if (threadIdx.x != 0) return;
  if constexpr (SINGLE) out[0] = st(MEAN ? (float)((double)acc / (double)n) : acc);
  else part[blockIdx.x] = acc;
}
)CU";

// nll: target i picks self[(row, class, s)] with row = i / HW, s = i % HW (HW = 1: no division).
// kc_pick gives the term and its weight (0 where ignored; NaN for a target out of range).
const char* kNllBody = R"CU(
__device__ __forceinline__ void kc_pick(const T* __restrict__ x, const long long* __restrict__ tg, const T* w,
                                        long long i, int C, long long HW, long long ign, float& v, float& wt) {
  const long long c = tg[i];
  v = 0.f;
  wt = 0.f;
  if (c == ign) return;
  if (c < 0 || c >= C) { v = KC_NAN; wt = KC_NAN; return; }
  long long row = i, s = 0;
  if constexpr (SPATIAL) { row = i / HW; s = i - row * HW; }
  wt = HAS_W ? ldp(w[c]) : 1.f;
  v = -(ld(x[(row * C + c) * HW + s]) * wt);
}
template <class F> __device__ __forceinline__ void kc_each_target(long long n, F fn) {
  const long long step = (long long)gridDim.x * NT * UNROLL;
  for (long long i = (long long)blockIdx.x * NT * UNROLL + threadIdx.x; i < n; i += step) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < n) fn(i + u * NT);
  }
}
extern "C" __global__ void __launch_bounds__(NT) kc_nll_map(T* __restrict__ out, T* __restrict__ total,
    const T* __restrict__ x, const long long* __restrict__ tg KC_W_PARAM, long long n, int C, long long HW, long long ign) {
  KC_W_LOCAL
  if (blockIdx.x == 0 && threadIdx.x == 0) total[0] = st(0.f);   // eager's total_weight without reduction
  kc_each_target(n, [&](long long i) {
    float v, wt;
    kc_pick(x, tg, w, i, C, HW, ign, v, wt);
    out[i] = st(v);
  });
}
__device__ __forceinline__ void kc_nll_store(T* out, T* total, float s, float wsum) {
  out[0] = st(MEAN ? s / wsum : s);
  total[0] = st(wsum);
}
extern "C" __global__ void __launch_bounds__(NT) kc_nll_part(float* __restrict__ part, T* __restrict__ out,
    T* __restrict__ total, const T* __restrict__ x, const long long* __restrict__ tg KC_W_PARAM, long long n, int C,
    long long HW, long long ign) {
  KC_W_LOCAL
  __shared__ float sh[64];
  float s = 0.f, ws = 0.f;
  kc_each_target(n, [&](long long i) {
    float v, wt;
    kc_pick(x, tg, w, i, C, HW, ign, v, wt);
    s += v;
    ws += wt;
  });
  kc_gsum2(s, ws, sh);
  if (threadIdx.x != 0) return;
  if constexpr (SINGLE) kc_nll_store(out, total, s, ws);
  else { part[2 * blockIdx.x] = s; part[2 * blockIdx.x + 1] = ws; }
}
extern "C" __global__ void __launch_bounds__(NT) kc_nll_final(T* __restrict__ out, T* __restrict__ total,
                                                              const float* __restrict__ part, int P) {
  __shared__ float sh[64];
  float s = 0.f, ws = 0.f;
  for (int i = threadIdx.x; i < P; i += NT) { s += part[2 * i]; ws += part[2 * i + 1]; }
  kc_gsum2(s, ws, sh);
  if (threadIdx.x == 0) kc_nll_store(out, total, s, ws);
}
)CU";

const std::vector<int64_t> kBlocks = {1, 132, 264, 528, 1056, 2112};

struct LossCfg {
  LossGeom g;
  DType dt = DType::kF32;
};

class LossTemplate : public Template {
 public:
  const char* name() const override { return "cuda.loss"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    LossCfg f;
    if (!handles(c, f)) return {};
    const bool nll = f.g.kind == LossKind::kNll;
    std::vector<KnobDim> sp = {{"threads", {256, 128, 512, 1024}}, {"unroll", {2, 1, 4}}};
    if (!nll) sp.push_back({"vec", vec_values(f)});
    if (f.g.elementwise()) {
      sp.push_back({"gs", {1, 0}});   // grid stride over a capped grid, or one round a thread
    } else {
      // One block for small calls, else about two waves of 256-thread blocks over the SMs.
      const int64_t work = f.g.terms / (nll ? 1 : 4);
      sp.push_back({"blocks", with_default(kBlocks, work < 16384 ? 1 : work < (int64_t{1} << 21) ? 264 : 1056)});
    }
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    LossCfg f;
    if (!handles(c, f)) return unsupported("cuda.loss does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    const Knobs k = kr.value();
    const bool nll = f.g.kind == LossKind::kNll, map = f.g.elementwise(), logits = f.g.kind == LossKind::kBceLogits;
    const int64_t nt = k.at("threads"), u = k.at("unroll"), vec = nll ? 1 : k.at("vec");
    const int64_t blocks = map ? 0 : k.at("blocks");
    std::string src = "// kernelcraft cuda.loss " + std::string(op_info(c.op).name) + " " + dtype_name(f.dt) + "\n" +
                      dtype_prelude(f.dt) + "constexpr int G = " + S(nt) + ", NT = G, VEC = " + S(vec) +
                      ", UNROLL = " + S(u) + ", KIND = " + S(static_cast<int>(f.g.kind)) + ";\n" +
                      "constexpr bool HAS_W = " + (f.g.weighted ? "true" : "false") +
                      ", MEAN = " + (f.g.reduction == LossReduction::kMean ? "true" : "false") +
                      ", SINGLE = " + (blocks == 1 ? "true" : "false") +
                      ", SPATIAL = " + (f.g.spatial > 1 ? "true" : "false") + ";\n" +
                      "__device__ __forceinline__ float ldp(T v) { return ld(v); }\n" +
                      (f.g.weighted ? "#define KC_W_PARAM , const T* __restrict__ w\n#define KC_W_LOCAL\n"
                                    : "#define KC_W_PARAM\n#define KC_W_LOCAL const T* w = nullptr; (void)w;\n") +
                      kGroupHelpers +
                      (nll ? std::string(kNllBody)
                           : logits ? logits_prelude(f.g) + kEachLoad + kLogitsBody + kLossFinal
                                    : std::string(kTermFn) + kEachLoad + kLossKernels + kLossFinal);
    return make_candidate(name(), k, std::move(src), launches(c, f, nt, u, vec, blocks, map, map ? k.at("gs") : 0),
                          scratch(nll, blocks));
  }

 private:
  // The vector widths of an elementwise call: the dtype's, and for bce with logits only those that
  // divide every suffix-broadcast parameter (a vector of terms then reads one of the parameter).
  static std::vector<int64_t> vec_values(const LossCfg& f) {
    std::vector<int64_t> v = f.dt == DType::kF32 ? std::vector<int64_t>{1, 2, 4} : std::vector<int64_t>{1, 2, 4, 8};
    if (f.g.kind == LossKind::kBceLogits)
      for (int64_t mod : {f.g.weighted ? f.g.w_mod : 0, f.g.pos_weighted ? f.g.pw_mod : 0})
        if (param_mode(mod, f.g.terms) == 2) v.erase(std::remove_if(v.begin(), v.end(), [&](int64_t x) { return mod % x; }), v.end());
    return with_default(v, v.back());
  }

  // A parameter's MODE (kLogitsBody): one element, self's sizes, or a suffix broadcast.
  static int param_mode(int64_t mod, int64_t terms) { return mod <= 1 ? 0 : mod >= terms ? 1 : 2; }

  static std::string logits_prelude(const LossGeom& g) {
    const int64_t wm = g.weighted ? g.w_mod : 0, pm = g.pos_weighted ? g.pw_mod : 0;
    return "constexpr bool HAS_P = " + std::string(g.pos_weighted ? "true" : "false") +
           ", IDX32 = " + (g.terms <= (int64_t{1} << 32) ? "true" : "false") + ";\nconstexpr int WMODE = " +
           S(param_mode(wm, g.terms)) + ", PMODE = " + S(param_mode(pm, g.terms)) +
           ";\nconstexpr unsigned long long WMOD = " + S(std::max<int64_t>(wm, 1)) + ", PMOD = " +
           S(std::max<int64_t>(pm, 1)) + ";\n" +
           (g.pos_weighted ? "#define KC_P_PARAM , const T* __restrict__ pw\n#define KC_P_LOCAL\n"
                           : "#define KC_P_PARAM\n#define KC_P_LOCAL const T* pw = nullptr; (void)pw;\n");
  }

  // The launches of a setting; the grid's work is vectors (elementwise) or targets (nll).
  static json launches(const OpCall& c, const LossCfg& f, int64_t nt, int64_t u, int64_t vec, int64_t blocks, bool map,
                       int64_t gs) {
    const bool nll = f.g.kind == LossKind::kNll, logits = f.g.kind == LossKind::kBceLogits;
    const std::string n = nll ? "numel(target)" : "numel(self)";
    const std::string rounds = "max(1, ceil_div(" + n + " / " + S(vec) + ", " + S(nt * u) + "))";
    std::vector<std::string> in = {"ptr:self", "ptr:target"};
    if (f.g.weighted) in.push_back("ptr:weight");
    if (f.g.pos_weighted) in.push_back("ptr:pos_weight");
    std::vector<std::string> tail = {"i64:" + n};
    if (nll) tail.insert(tail.end(), {"i32:" + S(f.g.classes), "i64:" + S(f.g.spatial), "i64:ignore_index"});
    else if (!logits) tail.push_back(c.scalar("beta") ? "f32:beta" : c.scalar("delta") ? "f32:delta" : "f32:0");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const std::vector<std::string> outs = nll ? std::vector<std::string>{"ptr:out0", "ptr:out1"} : std::vector<std::string>{"ptr:out0"};
    json ls = json::array();
    if (map) {
      const std::string grid = gs ? "min(" + rounds + ", " + S(kSms * (2048 / nt)) + ")" : rounds;
      ls.push_back(launch(nll ? "kc_nll_map" : logits ? "kc_logits_map" : "kc_loss_map", {grid}, {nt}, cat(cat(outs, in), tail)));
      return ls;
    }
    const std::string P = blocks == 1 ? "1" : "min(" + S(blocks) + ", " + rounds + ")";
    ls.push_back(launch(nll ? "kc_nll_part" : logits ? "kc_logits_part" : "kc_loss_part", {P}, {nt}, cat(cat(cat({"ptr:part"}, outs), in), tail)));
    if (blocks > 1) {
      std::vector<std::string> fin = cat(outs, {"ptr:part", "i32:" + P});
      if (!nll) fin.push_back("i64:" + n);
      ls.push_back(launch(nll ? "kc_nll_final" : "kc_loss_final", {1}, {nt}, fin));
    }
    return ls;
  }

  // The partials (a 4-byte placeholder for the single launch, whose part pointer goes unused).
  static json scratch(bool nll, int64_t blocks) {
    if (blocks == 0) return nullptr;
    return json::array({{{"name", "part"}, {"bytes", S(std::max<int64_t>(blocks, 1) * (nll ? 8 : 4))}}});
  }

  static bool handles(const OpCall& c, LossCfg& f) {
    if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kLoss || !c.dense()) return false;
    auto g = loss_geometry(c);
    if (!g.is_ok() || g->terms <= 0) return false;
    f.g = g.value();
    const TensorMeta &x = c.inputs[0], &t = c.inputs[1];
    f.dt = x.dtype;
    if (!elem_dtype(f.dt) || x.numel() == 0) return false;
    for (const auto& o : c.outputs)
      if (!o.defined || o.dtype != f.dt) return false;
    const TensorMeta* w = c.inputs.size() > 2 && c.inputs[2].defined ? &c.inputs[2] : nullptr;
    if (w && w->dtype != f.dt) return false;
    if (f.g.kind == LossKind::kNll)
      return t.dtype == DType::kI64 && f.g.classes <= INT_MAX && (!w || w->numel() == f.g.classes);
    if (f.g.kind == LossKind::kBceLogits) {   // weights of self's sizes or a suffix broadcast ([C])
      const TensorMeta* pw = c.input("pos_weight");
      return t.dtype == f.dt && t.sizes == x.sizes && f.g.w_mod >= 0 && f.g.pw_mod >= 0 &&
             !(pw && pw->defined && pw->dtype != f.dt);
    }
    if (t.dtype != f.dt || t.sizes != x.sizes || (w && w->sizes != x.sizes)) return false;   // no broadcasting
    if (f.g.kind == LossKind::kSmoothL1) return f.g.param >= 0;   // eager refuses a negative beta
    if (f.g.kind == LossKind::kHuber) return f.g.param > 0;       // and a non-positive delta
    return true;
  }
};

}  // namespace

const Template* cuda_loss_template() {
  static const LossTemplate t;
  return &t;
}

}  // namespace kc::evolve
