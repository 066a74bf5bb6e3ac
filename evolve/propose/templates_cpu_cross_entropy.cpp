// CPU fused cross-entropy forward (cpu.cross_entropy): kernelcraft::cross_entropy over self
// [N, C] or [C] in f32 or bf16 (weight and probabilities in self's dtype or fp32), class or
// probability targets, label smoothing, every reduction (evolve/ops/cross_entropy.h).
// Part of the CPU op-family templates (overview in templates_cpu.cpp).
//
// Blocks of `rows` rows; each row is two passes over self in cache: its max (KC_U lanes, NaN
// kept), then sum exp(x - max) and, beside it, the sums the loss needs, shifted by the max so
// they do not cancel against lse (knob acc: double lanes or Kahan float; vexp: libm or the inline
// exp). The row writes lse and its loss (reduction none, or a 1-d self's 0-dim loss) or its term
// and weight in double into scratch; a one-block launch then folds those in row order, so the
// bits do not depend on how blocks are threaded.
#include "evolve/propose/templates_cpu_common.h"
#include "evolve/propose/templates_cross_entropy.h"

namespace kc::evolve {

// The element types, their conversions and the call's flags, shared with the backward
// (templates_cpu_cross_entropy_backward.cpp).
std::string ce_cpu_prelude(const CeCall& f);

namespace {

using namespace cpu_tpl;
using nlohmann::json;

const char* kMaxFn = "static inline float kc_max(float m, float v) { return (v > m || v != v) ? v : m; }\n";

// Row r of a block: max, then the sums (step), then the row's term.
const char* kRowsBody = R"K(  const int64_t per = ctx->block[0];
  const float qa = 1.f - eps, qb = eps / (float)C;
  (void)w, (void)tg, (void)pr, (void)out, (void)part, (void)ign, (void)qa, (void)qb;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const kc_x_t* KC_RS xr = x + r * C;
      float mx[KC_U];
      for (int u = 0; u < KC_U; ++u) mx[u] = -INFINITY;
      int64_t j = 0;
      for (; j + KC_U <= C; j += KC_U)
        for (int u = 0; u < KC_U; ++u) mx[u] = kc_max(mx[u], kc_f(xr[j + u]));
      for (; j < C; ++j) mx[0] = kc_max(mx[0], kc_f(xr[j]));
      float m = mx[0];
      for (int u = 1; u < KC_U; ++u) m = kc_max(m, mx[u]);
      const float ms = m == -INFINITY ? 0.f : m;   /* a row of -inf: lse -inf, the loss NaN */
      kc_sum s[KC_U] = {}, sa[KC_U] = {}, sb[KC_U] = {};
      auto step = [&](int64_t k, int u) {
        const float v = kc_f(xr[k]) - ms;
        s[u].add((kc_acc_t)kc_exp(v));
        if (KC_SUMS) {
          float ww = KC_HAS_W ? kc_f(w[k]) : 1.f;
          if (KC_PROBS) ww *= qa * kc_f(pr[r * C + k]) + qb;
          sa[u].add((kc_acc_t)ww * v);
          if (KC_HAS_W || KC_PROBS) sb[u].add((kc_acc_t)ww);
        }
      };
      j = 0;
      for (; j + KC_U <= C; j += KC_U)
        for (int u = 0; u < KC_U; ++u) step(j + u, u);
      for (; j < C; ++j) step(j, 0);
      const double ls = log(kc_total(s)), A = kc_total(sa), B = kc_total(sb);   /* ls = lse - ms */
      lse[r] = m == INFINITY ? INFINITY : (float)(ms + ls);   /* logsumexp's value; the loss is NaN */
      double term = 0, wt = 1;
      if (KC_PROBS) {
        term = ls * B - A;
      } else {
        const int64_t c = tg[r];
        if (c == ign) {
          wt = 0;
        } else if (c < 0 || c >= C) {   /* eager raises; a kernel must not read outside the row */
          term = NAN;
          wt = NAN;
        } else {
          if (KC_HAS_W) wt = kc_f(w[c]);
          term = qa * wt * (ls - (double)(kc_f(xr[c]) - ms));
          if (KC_SMOOTH) term += qb * (ls * (KC_HAS_W ? B : (double)C) - A);
        }
      }
      if (KC_DIRECT) {
        kc_put(out + r, (float)(KC_MEAN ? term / wt : term));
      } else {
        part[2 * r] = term;
        part[2 * r + 1] = wt;
      }
    }
  }
)K";

// Mean: the terms over the weights, 0 / 0 = NaN when every row is ignored (probabilities: N).
const char* kFinalBody = R"K(  double s = 0, d = 0;
  for (int64_t i = 0; i < rows; ++i) {
    s += part[2 * i];
    d += part[2 * i + 1];
  }
  kc_put(out, (float)(KC_MEAN ? s / d : s));
)K";

class CrossEntropyTemplate : public Template {
 public:
  const char* name() const override { return "cpu.cross_entropy"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    CeCall f;
    if (!handles(c, f)) return {};
    return {{"rows", rows_values(f.g.rows, f.g.classes)}, {"unroll", kUnroll}, {"acc", kOnOff}, {"vexp", {0, 1}}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    CeCall f;
    if (!handles(c, f)) return unsupported("cpu.cross_entropy does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool direct = f.g.per_row() || f.g.one_d;
    std::string src = head(name(), std::string(dtype_name(f.x)) + (direct ? " per row" : " reduced"), k.value()) +
                      ce_cpu_prelude(f) + "#define KC_DIRECT " + (direct ? "1" : "0") + "\n" +
                      accumulators(k->at("acc") != 0) + exp_fn(k->at("vexp") != 0) + kMaxFn;
    const std::string rows = ce_rows_expr(), per = str(k->at("rows"));
    const std::string grid = "ceil_div(" + rows + ", " + per + ")";
    Args a;
    if (direct) {
      a.ptr("kc_l_t*", "out", "out0");
      a.nullptr_decl("double*", "part");
    } else {
      a.nullptr_decl("kc_l_t*", "out");
      a.ptr("double*", "part", "kc_part");
    }
    a.ptr("float*", "lse", "out1");
    a.ptr("const kc_x_t*", "x", "self");
    if (f.g.probs) {
      a.ptr("const kc_q_t*", "pr", "target");
      a.nullptr_decl("const int64_t*", "tg");
    } else {
      a.ptr("const int64_t*", "tg", "target");
      a.nullptr_decl("const kc_q_t*", "pr");
    }
    if (f.g.weighted) a.ptr("const kc_w_t*", "w", "weight");
    else a.nullptr_decl("const kc_w_t*", "w");
    a.i64("rows", rows);
    a.i64("C", ce_classes_expr());
    a.i64("ign", "ignore_index");
    a.f32("eps", "label_smoothing");
    src += kernel("kc_cpu_cross_entropy", a, kRowsBody);
    json ls = json::array({launch("kc_cpu_cross_entropy", grid, k->at("rows"), a.spec)}), scratch;
    if (!direct) {
      Args fa;
      fa.ptr("kc_l_t*", "out", "out0");
      fa.ptr("const double*", "part", "kc_part");
      fa.i64("rows", rows);
      src += kernel("kc_cpu_cross_entropy_final", fa, kFinalBody);
      ls.push_back(launch("kc_cpu_cross_entropy_final", "1", 1, fa.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", "(" + rows + ") * 16"}}});
    }
    return candidate(name(), k.value(), std::move(src), std::move(ls), std::move(scratch));
  }

 private:
  static bool handles(const OpCall& c, CeCall& f) {
    return ce_call(c, BackendKind::kCpu, OpFamily::kCrossEntropy, f) && ce_cpu_dtypes(f);
  }
};

}  // namespace

std::string ce_cpu_prelude(const CeCall& f) {
  auto ty = cpu_tpl::elem_type;
  auto flag = [](bool b) { return b ? "1" : "0"; };
  const bool smooth = f.g.label_smoothing > 0;
  std::string s = cpu_tpl::bf16_conversions();
  s += std::string("typedef ") + ty(f.x) + " kc_x_t;\ntypedef " + ty(f.g.weighted ? f.w : DType::kF32) +
       " kc_w_t;\ntypedef " + ty(f.g.probs ? f.q : DType::kF32) + " kc_q_t;\ntypedef " + ty(f.loss) + " kc_l_t;\n";
  s += std::string("#define KC_HAS_W ") + flag(f.g.weighted) + "\n#define KC_PROBS " + flag(f.g.probs) +
       "\n#define KC_SMOOTH " + flag(smooth) + "\n#define KC_SUMS " + flag(f.g.probs || smooth) + "\n#define KC_MEAN " +
       flag(f.g.reduction == LossReduction::kMean) + "\n#define KC_PER_ROW " + flag(f.g.per_row()) + "\n";
  return s;
}

const Template* cpu_cross_entropy_template() {
  static const CrossEntropyTemplate t;
  return &t;
}

}  // namespace kc::evolve
