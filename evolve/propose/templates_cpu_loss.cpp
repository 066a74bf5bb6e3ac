// CPU loss template (cpu.loss): mse_loss, smooth_l1_loss, huber_loss, binary_cross_entropy,
// binary_cross_entropy_with_logits, nll_loss_forward and nll_loss2d_forward, fp32, dense, int64
// nll targets; bce with logits' weight and pos_weight of self's sizes or a suffix of them ([C]).
// Part of the CPU op-family templates (overview in templates_cpu.cpp).
//
// Reduction none: blocks of `elems` terms, each written once. Mean and sum: block b sums its
// `elems` terms in a fixed order (KC_U accumulator lanes, double or Kahan float: knob acc) into
// part[b], then a one-block launch adds the partials in order and writes the result, so the bits
// do not depend on how blocks are threaded. nll sums terms and weights side by side and divides
// as eager does (0 / 0 = nan when every target is ignored); a target that is neither ignore_index
// nor a class gives NaN (eager raises; a kernel must not read outside self).
#include "evolve/ops/loss.h"
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// One term in float, as eager forms it (bce: logs clamped at -100, NaN kept as std::max keeps it).
const char* kTermFn = R"K(static inline float kc_term(float x, float t, float w, float p) {
  float v;
  (void)p;
  if (KC_KIND == 0) {
    const float d = x - t;
    v = d * d;
  } else if (KC_KIND == 1) {
    const float z = fabsf(x - t);
    v = z < p ? 0.5f * z * z / p : z - 0.5f * p;
  } else if (KC_KIND == 2) {
    const float z = fabsf(x - t);
    v = z < p ? 0.5f * z * z : p * (z - 0.5f * p);
  } else {
    float lx = logf(x), l1 = log1pf(-x);
    lx = lx < -100.f ? -100.f : lx;
    l1 = l1 < -100.f ? -100.f : l1;
    v = (t - 1.f) * l1 - t * lx;
  }
  return KC_HAS_W ? v * w : v;
}
#define KC_TERM(i) kc_term(x[i], t[i], KC_HAS_W ? w[i] : 1.f, p)
)K";

// bce with logits in float, in eager's order (ATen's Loss.cpp and log_sigmoid): ls = min(x, 0) -
// log1p(exp(-|x|)), times lw = (p - 1) t + 1 with pos_weight, v = (1 - t) x - ls, times weight.
// An infinite logit gives eager's inf or NaN (0 * inf, inf - inf) and a NaN logit NaN. KC_WI and
// KC_PI index the parameters (i, i % numel for a suffix broadcast; defined by the render).
const char* kLogitsTermFn = R"K(static inline float kc_term(float x, float t, float w, float pw) {
  float ls = (x < 0.f ? x : 0.f) - log1pf(expf(-fabsf(x)));
  if (KC_HAS_P) ls *= (pw - 1.f) * t + 1.f;
  const float v = (1.f - t) * x - ls;
  return KC_HAS_W ? v * w : v;
}
#define KC_TERM(i) kc_term(x[i], t[i], KC_HAS_W ? w[KC_WI(i)] : 1.f, KC_HAS_P ? pw[KC_PI(i)] : 1.f)
)K";

// The index of term i's element in a parameter of `mod` elements (loss.h LossGeom::w_mod): a
// constant modulus, so the compiler turns it into a multiply.
std::string param_index(int64_t mod, int64_t terms) {
  if (mod <= 1) return "0";
  return mod >= terms ? "(i)" : "((i) % " + str(mod) + ")";
}

// nll: target i picks self[(row, class, s)], row = i / hw, s = i % hw; weight 0 where ignored.
const char* kPickFn = R"K(static inline float kc_pick(const float* x, const int64_t* tg, const float* w, int64_t i,
                            int64_t C, int64_t hw, int64_t ign, float* wt) {
  const int64_t c = tg[i];
  *wt = 0.f;
  if (c == ign) return 0.f;
  if (c < 0 || c >= C) { *wt = NAN; return NAN; }
  const int64_t row = hw == 1 ? i : i / hw, s = hw == 1 ? 0 : i - row * hw;
  *wt = KC_HAS_W ? w[c] : 1.f;
  return -(x[(row * C + c) * hw + s] * *wt);
}
)K";

// The block loop: terms [lo, hi) of block b.
const char* kBlockHead = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = (b + 1) * per < n ? (b + 1) * per : n;
)K";

const char* kMapBody = R"K(@IVDEP@    for (int64_t i = lo; i < hi; ++i) out[i] = KC_TERM(i);
  }
)K";

const char* kNllMapBody = R"K(    if (b == 0) total[0] = 0.f;   /* eager's total_weight without reduction */
    for (int64_t i = lo; i < hi; ++i) {
      float wt;
      out[i] = kc_pick(x, tg, w, i, C, hw, ign, &wt);
    }
  }
)K";

// Lanes: term i goes to lane (i - lo) % KC_U; lanes are added in order at the end.
const char* kPartBody = R"K(    kc_sum acc[KC_U] = {};
    int64_t i = lo;
    for (; i + KC_U <= hi; i += KC_U)
      for (int u = 0; u < KC_U; ++u) acc[u].add((kc_acc_t)KC_TERM(i + u));
    for (int u = 0; i < hi; ++i, ++u) acc[u].add((kc_acc_t)KC_TERM(i));
    part[b] = kc_total(acc);
  }
)K";

const char* kNllPartBody = R"K(    kc_sum acc[KC_U] = {}, wacc[KC_U] = {};
    for (int64_t i = lo; i < hi; ++i) {
      float wt;
      const float v = kc_pick(x, tg, w, i, C, hw, ign, &wt);
      acc[(i - lo) % KC_U].add((kc_acc_t)v);
      wacc[(i - lo) % KC_U].add((kc_acc_t)wt);
    }
    part[2 * b] = kc_total(acc);
    part[2 * b + 1] = kc_total(wacc);
  }
)K";

const char* kFinalBody = R"K(  double s = 0;
  for (int64_t k = 0; k < parts; ++k) s += part[k];
  out[0] = (float)(KC_MEAN ? s / (double)n : s);
)K";

// Mean: S / W in double, rounded once (0 / 0 is nan, as eager's).
const char* kNllFinalBody = R"K(  double s = 0, ws = 0;
  for (int64_t k = 0; k < parts; ++k) { s += part[2 * k]; ws += part[2 * k + 1]; }
  out[0] = (float)(KC_MEAN ? s / ws : s);
  total[0] = (float)ws;
)K";

class LossTemplate : public Template {
 public:
  const char* name() const override { return "cpu.loss"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    LossGeom g;
    if (!handles(c, g)) return {};
    std::vector<KnobDim> s = {{"elems", elems_values(g.terms)}};
    if (g.elementwise()) {
      if (g.kind != LossKind::kNll) s.push_back({"simd", kOnOff});
    } else {
      s.push_back({"acc", kOnOff});
      s.push_back({"unroll", kUnroll});
    }
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    LossGeom g;
    if (!handles(c, g)) return unsupported("cpu.loss does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool nll = g.kind == LossKind::kNll, map = g.elementwise(), logits = g.kind == LossKind::kBceLogits;
    const std::string opname = op_info(c.op).name;
    std::string src = head(name(), opname + (g.weighted ? " weighted" : "") + (g.pos_weighted ? " pos_weighted" : "") +
                                       (map ? " none" : " reduced"), k.value()) +
                      "#define KC_KIND " + str(static_cast<int>(g.kind)) + "\n#define KC_HAS_W " +
                      (g.weighted ? "1" : "0") + "\n#define KC_MEAN " +
                      (g.reduction == LossReduction::kMean ? "1" : "0") + "\n";
    if (logits)
      src += std::string("#define KC_HAS_P ") + (g.pos_weighted ? "1" : "0") + "\n#define KC_WI(i) " +
             param_index(g.w_mod, g.terms) + "\n#define KC_PI(i) " + param_index(g.pw_mod, g.terms) + "\n";
    src += (map ? "" : accumulators(k->at("acc") != 0)) + (nll ? kPickFn : logits ? kLogitsTermFn : kTermFn);
    const int64_t per = k->at("elems");
    const std::string n = nll ? "numel(target)" : "numel(self)";
    const std::string grid = "ceil_div(" + n + ", " + str(per) + ")";
    json ls = json::array(), scratch;
    auto inputs = [&](Args& a) {
      a.ptr("const float*", "x", "self");
      if (nll) a.ptr("const int64_t*", "tg", "target");
      else a.ptr("const float*", "t", "target");
      if (g.weighted) a.ptr("const float*", "w", "weight");
      else a.nullptr_decl("const float*", "w");
      if (logits && g.pos_weighted) a.ptr("const float*", "pw", "pos_weight");
      else if (logits) a.nullptr_decl("const float*", "pw");
      a.i64("n", n);
      if (logits) return;
      if (nll) {
        a.i64("C", str(g.classes));
        a.i64("hw", str(g.spatial));
        a.i64("ign", "ignore_index");
      } else {
        a.f32("p", c.scalar("beta") ? "beta" : c.scalar("delta") ? "delta" : "0");
      }
    };
    auto outputs = [&](Args& a) {
      a.ptr("float*", "out", "out0");
      if (nll) a.ptr("float*", "total", "out1");
    };
    const std::string entry = "kc_cpu_" + opname;
    Args a;
    a.restrict_ptrs = map && k->count("simd") && k->at("simd");
    if (map) outputs(a);
    else a.ptr("double*", "part", "kc_part");
    inputs(a);
    const std::string body = !map ? (nll ? kNllPartBody : kPartBody)
                                  : nll ? kNllMapBody : replace_all(kMapBody, "@IVDEP@", ivdep(a.restrict_ptrs));
    src += kernel(entry, a, std::string("  (void)w;\n") + kBlockHead + body);
    ls.push_back(launch(entry, grid, per, a.spec));
    if (!map) {
      Args f;
      outputs(f);
      f.ptr("const double*", "part", "kc_part");
      f.i64("parts", grid);
      f.i64("n", n);
      src += kernel(entry + "_final", f, std::string("  (void)n;\n") + (nll ? kNllFinalBody : kFinalBody));
      ls.push_back(launch(entry + "_final", "1", 1, f.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", grid + " * " + (nll ? "16" : "8")}}});
    }
    return candidate(name(), k.value(), std::move(src), std::move(ls), std::move(scratch));
  }

 private:
  static bool handles(const OpCall& c, LossGeom& g) {
    if (c.backend != BackendKind::kCpu || op_info(c.op).family != OpFamily::kLoss || !c.dense()) return false;
    auto r = loss_geometry(c);
    if (!r.is_ok() || r->terms <= 0) return false;
    g = r.value();
    const TensorMeta &x = c.inputs[0], &t = c.inputs[1];
    if (x.dtype != DType::kF32 || x.numel() <= 0) return false;
    for (const auto& o : c.outputs)
      if (!o.defined || o.dtype != DType::kF32) return false;
    const TensorMeta* w = c.inputs.size() > 2 && c.inputs[2].defined ? &c.inputs[2] : nullptr;
    if (w && w->dtype != DType::kF32) return false;
    if (g.kind == LossKind::kNll) return t.dtype == DType::kI64;
    if (g.kind == LossKind::kBceLogits) return logits_params(c, g);
    if (t.dtype != DType::kF32 || t.sizes != x.sizes || (w && w->sizes != x.sizes)) return false;   // no broadcasting
    if (g.kind == LossKind::kSmoothL1) return g.param >= 0;   // eager refuses a negative beta
    if (g.kind == LossKind::kHuber) return g.param > 0;       // and a non-positive delta
    return true;
  }

  // bce with logits: self and target of one shape, weight and pos_weight absent or fp32, of
  // self's sizes or a suffix broadcast of them (any other broadcast stays eager's).
  static bool logits_params(const OpCall& c, const LossGeom& g) {
    const TensorMeta &x = c.inputs[0], &t = c.inputs[1];
    if (t.dtype != DType::kF32 || t.sizes != x.sizes || g.w_mod < 0 || g.pw_mod < 0) return false;
    const TensorMeta* pw = c.input("pos_weight");
    return !(pw && pw->defined && pw->dtype != DType::kF32);
  }
};

}  // namespace

const Template* cpu_loss_template() {
  static const LossTemplate t;
  return &t;
}

}  // namespace kc::evolve
