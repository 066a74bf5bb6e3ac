// CUDA loss backward template (cuda.loss_backward): mse_loss_backward,
// binary_cross_entropy_backward, smooth_l1_loss_backward, huber_loss_backward, nll_loss_backward
// and nll_loss2d_backward over dense tensors, f32 / f16 / bf16, fp32 math (halves' eager rounds
// each step to the half, and its norm and beta too). One elementwise pass over grad_input, VEC
// elements a thread, UNROLL vectors a round; grad_output is one value (reduction mean / sum) or
// one per term (none).
// nll writes every element of grad_input once, the picked class's gradient or 0, where eager
// zero-fills grad_input and then scatters (two passes). A target that is neither ignore_index nor
// a class gives NaN at its picks' row (eager raises; a kernel must not read outside its tensors).
#include "evolve/ops/loss.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// KIND of the elementwise kinds (the nll kernel does not read it).
std::string kind_value(LossKind k) {
  switch (k) {
    case LossKind::kMse: return "0";
    case LossKind::kSmoothL1: return "2";
    case LossKind::kHuber: return "3";
    default: return "1";
  }
}

const char* kCommon = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
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
)CU";

// d(loss)/d(self) of one element as CUDA eager forms it (ATen's cuda/PointwiseOpsKernel.cu): mse
// norm (x - t) g with norm = 2 (/ n); smooth_l1 with d = x - t: -norm g below -beta, norm g above
// beta, else norm d g / beta, so beta 0 gives 0 / 0 = NaN at d = 0 (CPU eager gives -norm g
// there), and NaN falls through to the last branch; huber the same with norm g delta and norm d
// g; norm = 1 (/ n); bce g (x - t) / max((1 - x) x, 1e-12), times w, over n for the mean.
const char* kElementwise = R"CU(
__device__ __forceinline__ float kc_grad(float g, float x, float t, float w, float p, long long n) {
  float v;
  if constexpr (KIND == 0) {
    v = (float)(MEAN ? 2.0 / (double)n : 2.0) * (x - t) * g;
  } else if constexpr (KIND == 2 || KIND == 3) {
    const float d = x - t, nm = (float)(MEAN ? 1.0 / (double)n : 1.0);
    if (d < -p) v = KIND == 2 ? -nm * g : -nm * g * p;
    else if (d > p) v = KIND == 2 ? nm * g : nm * g * p;
    else v = KIND == 2 ? nm * d * g / p : nm * d * g;
  } else {
    const float d = (1.f - x) * x;
    v = g * (x - t) / (d < 1e-12f ? 1e-12f : d);
    if constexpr (HAS_W) v *= w;
    if constexpr (MEAN) v /= (float)n;
  }
  return v;
}
extern "C" __global__ void __launch_bounds__(NT) kc_loss_grad(T* __restrict__ out, const T* __restrict__ go,
    const T* __restrict__ x, const T* __restrict__ t KC_W_PARAM, long long n, float p) {
  KC_W_LOCAL
  const float g0 = GSCALAR ? ld(go[0]) : 0.f;
  kc_each(n, [&](long long i, int cnt) {
    if (cnt == VEC) {
      const V xv = *reinterpret_cast<const V*>(x + i), tv = *reinterpret_cast<const V*>(t + i);
      V gv, wv, o;
      if constexpr (!GSCALAR) gv = *reinterpret_cast<const V*>(go + i);
      if constexpr (HAS_W) wv = *reinterpret_cast<const V*>(w + i);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        o.v[e] = st(kc_grad(GSCALAR ? g0 : ld(gv.v[e]), ld(xv.v[e]), ld(tv.v[e]), HAS_W ? ld(wv.v[e]) : 1.f, p, n));
      *reinterpret_cast<V*>(out + i) = o;
    } else {
      out[i] = st(kc_grad(GSCALAR ? g0 : ld(go[i]), ld(x[i]), ld(t[i]), HAS_W ? ld(w[i]) : 1.f, p, n));
    }
  });
}
)CU";

// nll: grad_input element e = ((row * C + c) * HW + s); its target is tg[row * HW + s]. A vector
// stays in one row and one class (VEC divides C when HW == 1, HW otherwise), so its index math is
// done once. Mean: -(g / W) w[c]; sum: -g w[c]; none: -g[target] w[c].
const char* kNll = R"CU(
__device__ __forceinline__ float kc_pick_grad(long long c, long long cl, float g, const T* w, int C, long long ign) {
  if (cl == ign) return 0.f;
  if (cl < 0 || cl >= C) return KC_NAN;
  if (c != cl) return 0.f;
  return HAS_W ? -g * ld(w[cl]) : -g;
}
extern "C" __global__ void __launch_bounds__(NT) kc_nll_grad(T* __restrict__ out, const T* __restrict__ go,
    const long long* __restrict__ tg KC_W_PARAM, const T* __restrict__ total, long long n, int C, long long HW,
    long long ign) {
  KC_W_LOCAL
  (void)total;
  float g0 = 0.f;
  if constexpr (GSCALAR) g0 = MEAN ? ld(go[0]) / ld(total[0]) : ld(go[0]);
  kc_each(n, [&](long long e, int cnt) {
    long long row, c, s = 0;
    if constexpr (SPATIAL) {
      const long long p = e / HW;
      s = e - p * HW;
      row = p / C;
      c = p - row * C;
    } else {
      row = e / C;
      c = e - row * C;
    }
    const long long ti = row * HW + s;
    if (cnt == VEC) {
      V o;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const long long tk = SPATIAL ? ti + k : ti, ck = SPATIAL ? c : c + k;
        o.v[k] = st(kc_pick_grad(ck, tg[tk], GSCALAR ? g0 : ld(go[tk]), w, C, ign));
      }
      *reinterpret_cast<V*>(out + e) = o;
    } else {
      out[e] = st(kc_pick_grad(c, tg[ti], GSCALAR ? g0 : ld(go[ti]), w, C, ign));
    }
  });
}
)CU";

struct Cfg {
  LossGeom g;
  DType dt = DType::kF32;
};

class LossBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.loss_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Cfg f;
    if (!handles(c, f)) return {};
    // A vector stays in one row (nll: one class row, or one spatial plane of nll2d).
    const int64_t along = f.g.kind != LossKind::kNll ? 0 : f.g.spatial > 1 ? f.g.spatial : f.g.classes;
    std::vector<int64_t> vecs;
    for (int64_t v : {1, 2, 4, 8})
      if ((v <= 4 || f.dt != DType::kF32) && (along == 0 || along % v == 0)) vecs.push_back(v);
    return {{"threads", {256, 128, 512, 1024}}, {"vec", with_default(vecs, vecs.back())}, {"unroll", {2, 1, 4}},
            {"gs", {1, 0}}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    Cfg f;
    if (!handles(c, f)) return unsupported("cuda.loss_backward does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    const Knobs k = kr.value();
    const bool nll = f.g.kind == LossKind::kNll;
    const int64_t nt = k.at("threads"), vec = k.at("vec"), u = k.at("unroll");
    std::string src = "// kernelcraft cuda.loss_backward " + std::string(op_info(c.op).name) + " " + dtype_name(f.dt) +
                      "\n" + dtype_prelude(f.dt) + "constexpr int NT = " + S(nt) + ", VEC = " + S(vec) +
                      ", UNROLL = " + S(u) + ", KIND = " + kind_value(f.g.kind) + ";\n" +
                      "constexpr bool HAS_W = " + (f.g.weighted ? "true" : "false") +
                      ", MEAN = " + (f.g.reduction == LossReduction::kMean ? "true" : "false") +
                      ", GSCALAR = " + (f.g.elementwise() ? "false" : "true") +
                      ", SPATIAL = " + (f.g.spatial > 1 ? "true" : "false") + ";\n" +
                      (f.g.weighted ? "#define KC_W_PARAM , const T* __restrict__ w\n#define KC_W_LOCAL\n"
                                    : "#define KC_W_PARAM\n#define KC_W_LOCAL const T* w = nullptr; (void)w;\n") +
                      kCommon + (nll ? kNll : kElementwise);
    std::vector<std::string> args = {"ptr:out0", "ptr:grad_output"};
    if (!nll) args.insert(args.end(), {"ptr:self", "ptr:target"});
    else args.push_back("ptr:target");
    if (f.g.weighted) args.push_back("ptr:weight");
    if (nll) args.insert(args.end(), {"ptr:total_weight", "i64:numel(self)", "i32:" + S(f.g.classes),
                                      "i64:" + S(f.g.spatial), "i64:ignore_index"});
    else args.insert(args.end(), {"i64:numel(self)", c.scalar("beta") ? "f32:beta" : c.scalar("delta") ? "f32:delta" : "f32:0"});
    const std::string rounds = "max(1, ceil_div(numel(self) / " + S(vec) + ", " + S(nt * u) + "))";
    const std::string grid = k.at("gs") ? "min(" + rounds + ", " + S(kSms * (2048 / nt)) + ")" : rounds;
    const std::string entry = nll ? "kc_nll_grad" : "kc_loss_grad";
    return make_candidate(name(), k, std::move(src), json::array({launch(entry, {grid}, {nt}, args)}));
  }

 private:
  static bool handles(const OpCall& c, Cfg& f) {
    if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kLossBackward || !c.dense()) return false;
    auto g = loss_geometry(c);
    if (!g.is_ok() || g->terms <= 0) return false;
    f.g = g.value();
    const TensorMeta *x = c.input("self"), *t = c.input("target"), *go = c.input("grad_output"), *w = c.input("weight");
    f.dt = x->dtype;
    if (!elem_dtype(f.dt) || x->numel() == 0 || !go || go->dtype != f.dt) return false;
    if (c.outputs.size() != 1 || c.outputs[0].dtype != f.dt || c.outputs[0].sizes != x->sizes) return false;
    if (w && w->defined && w->dtype != f.dt) return false;
    // grad_output: one per term without reduction, else one value.
    if (go->numel() != (f.g.elementwise() ? f.g.terms : 1)) return false;
    if (f.g.kind == LossKind::kNll) {
      const TensorMeta* tw = c.input("total_weight");
      return t->dtype == DType::kI64 && tw && tw->defined && tw->dtype == f.dt && tw->numel() == 1 && f.g.classes <= INT_MAX;
    }
    if (t->dtype != f.dt || t->sizes != x->sizes || (w && w->defined && w->sizes != x->sizes)) return false;
    if (f.g.kind == LossKind::kSmoothL1 && f.g.param < 0) return false;   // no forward takes these
    if (f.g.kind == LossKind::kHuber && f.g.param <= 0) return false;
    return !f.g.elementwise() || go->sizes == x->sizes;
  }
};

}  // namespace

const Template* cuda_loss_backward_template() {
  static const LossBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
