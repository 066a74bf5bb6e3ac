// CPU fused cross-entropy backward (cpu.cross_entropy_backward): grad_self of
// kernelcraft::cross_entropy from the forward's lse, f32 or bf16 (evolve/ops/cross_entropy.h has
// the formulas). Part of the CPU op-family templates (overview in templates_cpu.cpp).
//
// Class targets first need the mean's D (weights of the rows not ignored) and, with weighted
// smoothing, W = sum_j w_j: a one-block launch sums them in double in a fixed order into scratch
// (calls that need neither are one launch). Then blocks of `rows` rows write each element once,
// exp(x - lse) times two per-row constants less a weight (probabilities: a first pass over the
// target row for sum_k w_k q_k, in double). Ignored rows are zeros; a target neither ignored nor
// a class makes its row NaN (the mean's D too, so every row not ignored); a row holding +inf
// (lse +inf) is NaN, as eager's softmax is.
// Knobs: rows, vexp (libm or the inline exp), simd (restrict + ivdep on the element loops).
#include "evolve/propose/templates_cpu_common.h"
#include "evolve/propose/templates_cross_entropy.h"

namespace kc::evolve {

std::string ce_cpu_prelude(const CeCall& f);

namespace {

using namespace cpu_tpl;
using nlohmann::json;

const char* kPrepBody = R"K(  double d = 0, ws = 0;
  (void)w;
  if (KC_MEAN)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t c = tg[i];
      if (c == ign) continue;
      d += c < 0 || c >= C ? (double)NAN : KC_HAS_W ? (double)kc_f(w[c]) : 1.0;
    }
  if (KC_HAS_W && KC_SMOOTH)
    for (int64_t j = 0; j < C; ++j) ws += kc_f(w[j]);
  st[0] = d;
  st[1] = ws;
)K";

const char* kGradBody = R"K(  const int64_t per = ctx->block[0];
  const float qa = 1.f - eps, qb = eps / (float)C;
  (void)w, (void)tg, (void)pr, (void)st, (void)ign;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      double s = kc_f(gr[KC_PER_ROW ? r : 0]);
      if (KC_MEAN) s = KC_PROBS ? s / (double)rows : s / st[0];
      const float l = lse[r] == INFINITY ? NAN : lse[r];
      const kc_x_t* KC_RS xr = x + r * C;
      kc_x_t* KC_RS gxr = gx + r * C;
      if (KC_PROBS) {
        const kc_q_t* KC_RS p = pr + r * C;
        double Q = 0;
        for (int64_t j = 0; j < C; ++j) Q += (KC_HAS_W ? kc_f(w[j]) : 1.f) * (qa * kc_f(p[j]) + qb);
        const float sf = (float)s, Qf = (float)Q;
@IVDEP@        for (int64_t j = 0; j < C; ++j) {
          const float wq = (KC_HAS_W ? kc_f(w[j]) : 1.f) * (qa * kc_f(p[j]) + qb);
          kc_put(gxr + j, sf * (kc_exp(kc_f(xr[j]) - l) * Qf - wq));
        }
        continue;
      }
      const int64_t c = tg[r];
      if (c == ign || c < 0 || c >= C) {
        const float z = c == ign ? 0.f : NAN;
        for (int64_t j = 0; j < C; ++j) kc_put(gxr + j, z);
        continue;
      }
      const double wt = KC_HAS_W ? kc_f(w[c]) : 1.0;
      const float A = (float)(s * qa * wt), B = (float)(s * qb), W = KC_HAS_W && KC_SMOOTH ? (float)st[1] : (float)C;
      (void)B, (void)W;
@IVDEP@      for (int64_t j = 0; j < C; ++j) {
        const float P = kc_exp(kc_f(xr[j]) - l);
        float g = A * (P - (j == c ? 1.f : 0.f));
        if (KC_SMOOTH) g += B * (W * P - (KC_HAS_W ? kc_f(w[j]) : 1.f));
        kc_put(gxr + j, g);
      }
    }
  }
)K";

class CrossEntropyBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.cross_entropy_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    CeCall f;
    if (!handles(c, f)) return {};
    return {{"rows", rows_values(f.g.rows, f.g.classes)}, {"vexp", {0, 1}}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    CeCall f;
    if (!handles(c, f)) return unsupported("cpu.cross_entropy_backward does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    const bool prep = !f.g.probs && (f.g.reduction == LossReduction::kMean || (f.g.weighted && f.g.label_smoothing > 0));
    std::string src = head(name(), dtype_name(f.x), k.value()) + ce_cpu_prelude(f) + exp_fn(k->at("vexp") != 0);
    const std::string rows = ce_rows_expr();
    auto weight = [&](Args& a) {
      if (f.g.weighted) a.ptr("const kc_w_t*", "w", "weight");
      else a.nullptr_decl("const kc_w_t*", "w");
    };
    json ls = json::array(), scratch;
    if (prep) {
      Args p;
      p.ptr("double*", "st", "kc_st");
      p.ptr("const int64_t*", "tg", "target");
      weight(p);
      p.i64("rows", rows);
      p.i64("C", ce_classes_expr());
      p.i64("ign", "ignore_index");
      src += kernel("kc_cpu_cross_entropy_prep", p, kPrepBody);
      ls.push_back(launch("kc_cpu_cross_entropy_prep", "1", 1, p.spec));
      scratch = json::array({{{"name", "kc_st"}, {"bytes", 16}}});
    }
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("kc_x_t*", "gx", "out0");
    a.ptr("const kc_l_t*", "gr", "grad");
    a.ptr("const kc_x_t*", "x", "self");
    if (f.g.probs) {
      a.ptr("const kc_q_t*", "pr", "target");
      a.nullptr_decl("const int64_t*", "tg");
    } else {
      a.ptr("const int64_t*", "tg", "target");
      a.nullptr_decl("const kc_q_t*", "pr");
    }
    weight(a);
    a.ptr("const float*", "lse", "lse");
    if (prep) a.ptr("const double*", "st", "kc_st");
    else a.nullptr_decl("const double*", "st");
    a.i64("rows", rows);
    a.i64("C", ce_classes_expr());
    a.i64("ign", "ignore_index");
    a.f32("eps", "label_smoothing");
    src += kernel("kc_cpu_cross_entropy_backward", a, replace_all(kGradBody, "@IVDEP@", ivdep(simd)));
    const int64_t per = k->at("rows");
    ls.push_back(launch("kc_cpu_cross_entropy_backward", "ceil_div(" + rows + ", " + str(per) + ")", per, a.spec));
    return candidate(name(), k.value(), std::move(src), std::move(ls), std::move(scratch));
  }

 private:
  static bool handles(const OpCall& c, CeCall& f) {
    return ce_call(c, BackendKind::kCpu, OpFamily::kCrossEntropyBackward, f) && ce_cpu_dtypes(f);
  }
};

}  // namespace

const Template* cpu_cross_entropy_backward_template() {
  static const CrossEntropyBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
