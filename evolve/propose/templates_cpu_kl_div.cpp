// CPU KL divergence templates (cpu.kl_div, cpu.kl_div_backward): kernelcraft::kl_div and its
// backward, fp32, self and target dense of one shape. Part of the CPU op-family templates
// (overview in templates_cpu.cpp).
//
// Forward, reduction none: blocks of `elems` terms, each written once. Mean and sum: block b sums
// its `elems` terms in a fixed order (KC_U accumulator lanes, double or Kahan float: knob acc)
// into part[b], then a one-block launch adds the partials in order and writes the result, so the
// bits do not depend on how blocks are threaded (cpu.loss's scheme). Eager writes the elementwise
// loss (through xlogy, mul and sub: four passes) and reduces it; here self and target are read
// once. Backward: one elementwise pass, -t g or -exp(t) g (g over n for the mean).
#include "evolve/ops/kl_div.h"
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// One term in float, as eager forms it: xlogy(t, t) - t x (xlogy's 0 where t == 0; NaN kept), or
// exp(t) (t - x) with log_target.
const char* kTermFn = R"K(static inline float kc_term(float x, float t) {
  if (KC_LOG_T) return expf(t) * (t - x);
  return (t == 0.f ? 0.f : t * logf(t)) - t * x;
}
)K";

const char* kBlockHead = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = (b + 1) * per < n ? (b + 1) * per : n;
)K";

const char* kMapBody = R"K(@IVDEP@    for (int64_t i = lo; i < hi; ++i) out[i] = kc_term(x[i], t[i]);
  }
)K";

// Lanes: term i goes to lane (i - lo) % KC_U; lanes are added in order at the end.
const char* kPartBody = R"K(    kc_sum acc[KC_U] = {};
    int64_t i = lo;
    for (; i + KC_U <= hi; i += KC_U)
      for (int u = 0; u < KC_U; ++u) acc[u].add((kc_acc_t)kc_term(x[i + u], t[i + u]));
    for (int u = 0; i < hi; ++i, ++u) acc[u].add((kc_acc_t)kc_term(x[i], t[i]));
    part[b] = kc_total(acc);
  }
)K";

const char* kFinalBody = R"K(  double s = 0;
  for (int64_t k = 0; k < parts; ++k) s += part[k];
  out[0] = (float)(KC_MEAN ? s / (double)n : s);
)K";

// The composite's autograd: -(g t) or -(g exp(t)); the mean's g is grad / n in float, as eager's
// MeanBackward divides.
const char* kGradBody = R"K(  const int64_t per = ctx->block[0];
  const float g0 = KC_MEAN ? go[0] / (float)n : go[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per, hi = (b + 1) * per < n ? (b + 1) * per : n;
@IVDEP@    for (int64_t i = lo; i < hi; ++i) {
      const float g = KC_GSCALAR ? g0 : go[i];
      out[i] = -(g * (KC_LOG_T ? expf(t[i]) : t[i]));
    }
  }
)K";

bool handles(const OpCall& c, OpFamily fam, KlDivGeom& g) {
  if (op_info(c.op).family != fam || !dense_f32(c)) return false;
  auto r = kl_div_geometry(c);
  if (!r.is_ok() || r->terms <= 0) return false;
  g = r.value();
  return c.outputs.size() == 1 && c.outputs[0].defined;
}

std::string defines(const KlDivGeom& g) {
  return std::string("#define KC_LOG_T ") + (g.log_target ? "1" : "0") + "\n#define KC_MEAN " +
         (g.reduction == LossReduction::kMean ? "1" : "0") + "\n#define KC_GSCALAR " + (g.elementwise() ? "0" : "1") + "\n";
}

class KlDivTemplate : public Template {
 public:
  const char* name() const override { return "cpu.kl_div"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDiv, g)) return {};
    std::vector<KnobDim> s = {{"elems", elems_values(g.terms)}};
    if (g.elementwise()) {
      s.push_back({"simd", kOnOff});
    } else {
      s.push_back({"acc", kOnOff});
      s.push_back({"unroll", kUnroll});
    }
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDiv, g)) return unsupported("cpu.kl_div does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool map = g.elementwise();
    std::string src = head(name(), std::string("kl_div") + (g.log_target ? " log_target" : "") + (map ? " none" : " reduced"),
                           k.value()) +
                      defines(g) + (map ? "" : accumulators(k->at("acc") != 0)) + kTermFn;
    const int64_t per = k->at("elems");
    const std::string grid = "ceil_div(numel(self), " + str(per) + ")", entry = "kc_cpu_kl_div";
    auto inputs = [&](Args& a) {
      a.ptr("const float*", "x", "self");
      a.ptr("const float*", "t", "target");
      a.i64("n", "numel(self)");
    };
    Args a;
    a.restrict_ptrs = map && k->at("simd") != 0;
    if (map) a.ptr("float*", "out", "out0");
    else a.ptr("double*", "part", "kc_part");
    inputs(a);
    const std::string body = map ? replace_all(kMapBody, "@IVDEP@", ivdep(a.restrict_ptrs)) : kPartBody;
    src += kernel(entry, a, std::string(kBlockHead) + body);
    json ls = json::array({launch(entry, grid, per, a.spec)}), scratch;
    if (!map) {
      Args f;
      f.ptr("float*", "out", "out0");
      f.ptr("const double*", "part", "kc_part");
      f.i64("parts", grid);
      f.i64("n", "numel(self)");
      src += kernel(entry + "_final", f, std::string("  (void)n;\n") + kFinalBody);
      ls.push_back(launch(entry + "_final", "1", 1, f.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", grid + " * 8"}}});
    }
    return candidate(name(), k.value(), std::move(src), std::move(ls), std::move(scratch));
  }
};

class KlDivBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.kl_div_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDivBackward, g)) return {};
    return {{"elems", elems_values(g.terms)}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDivBackward, g)) return unsupported("cpu.kl_div_backward does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const std::string entry = "kc_cpu_kl_div_backward";
    std::string src = head(name(), std::string("kl_div_backward") + (g.log_target ? " log_target" : "") +
                                       (g.elementwise() ? " none" : " reduced"), k.value()) + defines(g);
    Args a;
    a.restrict_ptrs = k->at("simd") != 0;
    a.ptr("float*", "out", "out0");
    a.ptr("const float*", "go", "grad");
    a.ptr("const float*", "t", "target");
    a.i64("n", "numel(self)");
    src += kernel(entry, a, replace_all(kGradBody, "@IVDEP@", ivdep(a.restrict_ptrs)));
    const std::string grid = "ceil_div(numel(self), " + str(k->at("elems")) + ")";
    return candidate(name(), k.value(), std::move(src), json::array({launch(entry, grid, k->at("elems"), a.spec)}));
  }
};

}  // namespace

const Template* cpu_kl_div_template() {
  static const KlDivTemplate t;
  return &t;
}

const Template* cpu_kl_div_backward_template() {
  static const KlDivBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
