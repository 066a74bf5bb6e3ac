// CPU loss backward template (cpu.loss_backward): mse_loss_backward,
// binary_cross_entropy_backward, smooth_l1_loss_backward, huber_loss_backward, nll_loss_backward
// and nll_loss2d_backward, fp32, dense, int64 nll targets. Part of the CPU op-family templates
// (overview in templates_cpu.cpp).
//
// Elementwise: blocks of `elems` elements of grad_input, each written once from grad_output (one
// value for mean / sum, one per element for none). nll: blocks of `elems` targets; each writes the
// C elements of its (row, s) column of grad_input, the picked class's gradient or 0 (eager
// zero-fills, then scatters). A target that is neither ignore_index nor a class gives NaN in its
// column (eager raises; a kernel must not read outside its tensors).
#include "evolve/ops/loss.h"
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// KC_KIND of the elementwise kinds (the nll body does not read it).
std::string kind_value(LossKind k) {
  switch (k) {
    case LossKind::kMse: return "0";
    case LossKind::kSmoothL1: return "2";
    case LossKind::kHuber: return "3";
    default: return "1";
  }
}

// As CPU eager forms it (ATen's cpu/PointwiseOpsKernel.cpp, the vectorized path, which its scalar
// tail agrees with): mse norm (x - t) g, norm = 2 (/ n); smooth_l1 norm o g with o = sign-like
// (d > 0 ? 1 : -1) where |d| >= beta, else d / beta: so beta 0 gives -norm g at d = 0 and NaN
// stays NaN (the comparison fails); huber the same with o = +-delta or d; norm = 1 (/ n);
// bce g (x - t) / max((1 - x) x, 1e-12), times w, over n for the mean.
const char* kElementwise = R"K(static inline float kc_grad(float g, float x, float t, float w, float p, int64_t n) {
  float v;
  (void)w;
  (void)p;
  if (KC_KIND == 0) {
    v = (float)(KC_MEAN ? 2.0 / (double)n : 2.0) * (x - t) * g;
  } else if (KC_KIND == 2 || KC_KIND == 3) {
    const float d = x - t, s = d > 0.f ? 1.f : -1.f;
    const float o = fabsf(d) >= p ? (KC_KIND == 2 ? s : s * p) : (KC_KIND == 2 ? d / p : d);
    v = (float)(KC_MEAN ? 1.0 / (double)n : 1.0) * o * g;
  } else {
    const float d = (1.f - x) * x;
    v = g * (x - t) / (d < 1e-12f ? 1e-12f : d);
    if (KC_HAS_W) v *= w;
    if (KC_MEAN) v /= (float)n;
  }
  return v;
}
)K";

const char* kElementwiseBody = R"K(  (void)w;
  const int64_t per = ctx->block[0];
  const float g0 = go[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = (b + 1) * per < n ? (b + 1) * per : n;
@IVDEP@    for (int64_t i = lo; i < hi; ++i)
      out[i] = kc_grad(KC_GSCALAR ? g0 : go[i], x[i], t[i], KC_HAS_W ? w[i] : 1.f, p, n);
  }
)K";

// Mean: -(g / W) w[c]; sum: -g w[c]; none: -g[target] w[c].
const char* kNllBody = R"K(  (void)w;
  const int64_t per = ctx->block[0];
  const float g0 = KC_MEAN ? go[0] / total[0] : go[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = (b + 1) * per < n ? (b + 1) * per : n;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t row = i / hw, s = i - row * hw, cl = tg[i];
      float* col = out + row * C * hw + s;
      const int bad = cl != ign && (cl < 0 || cl >= C);
      for (int64_t c = 0; c < C; ++c) col[c * hw] = bad ? NAN : 0.f;
      if (bad || cl == ign) continue;
      const float g = KC_GSCALAR ? g0 : go[i];
      col[cl * hw] = KC_HAS_W ? -g * w[cl] : -g;
    }
  }
)K";

class LossBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.loss_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    LossGeom g;
    if (!handles(c, g)) return {};
    if (g.kind == LossKind::kNll) return {{"elems", rows_values(g.terms, g.classes)}};
    return {{"elems", elems_values(g.terms)}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    LossGeom g;
    if (!handles(c, g)) return unsupported("cpu.loss_backward does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool nll = g.kind == LossKind::kNll;
    const std::string opname = op_info(c.op).name, entry = "kc_cpu_" + opname;
    std::string src = head(name(), opname + (g.weighted ? " weighted" : "") + (g.elementwise() ? " none" : " reduced"),
                           k.value()) +
                      "#define KC_KIND " + kind_value(g.kind) + "\n#define KC_HAS_W " +
                      (g.weighted ? "1" : "0") + "\n#define KC_MEAN " + (g.reduction == LossReduction::kMean ? "1" : "0") +
                      "\n#define KC_GSCALAR " + (g.elementwise() ? "0" : "1") + "\n";
    Args a;
    a.restrict_ptrs = !nll && k->at("simd") != 0;
    a.ptr("float*", "out", "out0");
    a.ptr("const float*", "go", "grad_output");
    if (!nll) {
      a.ptr("const float*", "x", "self");
      a.ptr("const float*", "t", "target");
    } else {
      a.ptr("const int64_t*", "tg", "target");
    }
    if (g.weighted) a.ptr("const float*", "w", "weight");
    else a.nullptr_decl("const float*", "w");
    const std::string n = nll ? "numel(target)" : "numel(self)";
    a.i64("n", n);
    if (!nll) a.f32("p", c.scalar("beta") ? "beta" : c.scalar("delta") ? "delta" : "0");
    if (nll) {
      a.ptr("const float*", "total", "total_weight");
      a.i64("C", str(g.classes));
      a.i64("hw", str(g.spatial));
      a.i64("ign", "ignore_index");
      src += kernel(entry, a, kNllBody);
    } else {
      src += kElementwise + kernel(entry, a, replace_all(kElementwiseBody, "@IVDEP@", ivdep(a.restrict_ptrs)));
    }
    const int64_t per = k->at("elems");
    json ls = json::array({launch(entry, "ceil_div(" + n + ", " + str(per) + ")", per, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(ls));
  }

 private:
  static bool handles(const OpCall& c, LossGeom& g) {
    if (c.backend != BackendKind::kCpu || op_info(c.op).family != OpFamily::kLossBackward || !c.dense()) return false;
    auto r = loss_geometry(c);
    if (!r.is_ok() || r->terms <= 0) return false;
    g = r.value();
    const TensorMeta *x = c.input("self"), *t = c.input("target"), *go = c.input("grad_output"), *w = c.input("weight");
    if (x->dtype != DType::kF32 || x->numel() <= 0 || !go || go->dtype != DType::kF32) return false;
    if (c.outputs.size() != 1 || c.outputs[0].dtype != DType::kF32 || c.outputs[0].sizes != x->sizes) return false;
    if (w && w->defined && w->dtype != DType::kF32) return false;
    if (go->numel() != (g.elementwise() ? g.terms : 1)) return false;
    if (g.kind == LossKind::kNll) {
      const TensorMeta* tw = c.input("total_weight");
      return t->dtype == DType::kI64 && tw && tw->defined && tw->dtype == DType::kF32 && tw->numel() == 1;
    }
    if (t->dtype != DType::kF32 || t->sizes != x->sizes || (w && w->defined && w->sizes != x->sizes)) return false;
    if (g.kind == LossKind::kSmoothL1 && g.param < 0) return false;   // no forward takes these
    if (g.kind == LossKind::kHuber && g.param <= 0) return false;
    return !g.elementwise() || go->sizes == x->sizes;
  }
};

}  // namespace

const Template* cpu_loss_backward_template() {
  static const LossBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
