// CPU fused RMSNorm forward (cpu.rms_norm): kernelcraft::rms_norm over rows of K =
// prod(normalized_shape) elements in f32 or bf16, weight present or absent (evolve/ops/rms_norm.h
// has the formulas). Part of the CPU op-family templates (overview in templates_cpu.cpp).
//
// A row's sum of squares runs in KC_U lanes (knob acc: double, or Kahan-compensated float), rstd
// in double from it, rounded once to fp32; then out = (x rstd) w in fp32, rounded once to the
// input's dtype. Blocks are `rows` whole rows, or (split) chunks of a few long rows: the chunks'
// sums go to scratch in double, and every chunk of a row adds its row's sums in chunk order (so all
// agree on rstd, whatever the threading) before it scales itself. The source depends only on the
// dtype, the weight and the code-shaping knobs; work splits are in the launch spec.
#include "evolve/propose/templates_cpu_common.h"
#include "evolve/propose/templates_rms_norm.h"

namespace kc::evolve {

// The element types, the weight flag and the accumulators, shared with the backward
// (templates_cpu_rms_norm_backward.cpp).
std::string rms_cpu_prelude(const RmsCall& f, const Knobs& k);

namespace {

using namespace cpu_tpl;
using nlohmann::json;

// Sum of squares of x[j0, j1) and the scaling of a row's [j0, j1).
const char* kRowFns = R"K(static inline double kc_sumsq(const kc_x_t* KC_RS x, int64_t j0, int64_t j1) {
  kc_sum s[KC_U] = {};
  int64_t j = j0;
  for (; j + KC_U <= j1; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const kc_acc_t v = (kc_acc_t)kc_f(x[j + u]);
      s[u].add(v * v);
    }
  for (; j < j1; ++j) {
    const kc_acc_t v = (kc_acc_t)kc_f(x[j]);
    s[0].add(v * v);
  }
  return kc_total(s);
}
static inline void kc_scale(const kc_x_t* KC_RS x, const kc_x_t* KC_RS w, kc_x_t* KC_RS y, int64_t j0, int64_t j1,
                            float rf) {
  (void)w;
@IVDEP@  for (int64_t j = j0; j < j1; ++j) kc_put(y + j, KC_HAS_W ? (kc_f(x[j]) * rf) * kc_f(w[j]) : kc_f(x[j]) * rf);
}
)K";

const char* kRowsBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float rf = (float)(1.0 / sqrt(kc_sumsq(in + r * n, 0, n) / (double)n + eps));
      rstd[r] = rf;
      kc_scale(in + r * n, w, out + r * n, 0, n, rf);
    }
  }
)K";

const char* kPartBody = R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    part[b] = kc_sumsq(in + r * n, j0, j1);
  }
)K";

const char* kApplyBody = R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, c = b % nc, j0 = c * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double ss = 0;
    for (int64_t i = 0; i < nc; ++i) ss += part[r * nc + i];
    const float rf = (float)(1.0 / sqrt(ss / (double)n + eps));
    if (c == 0) rstd[r] = rf;
    kc_scale(in + r * n, w, out + r * n, j0, j1, rf);
  }
)K";

const char* kRowsExpr = "numel(out1)";
const char* kColsExpr = "numel(input) / numel(out1)";

class RmsNormTemplate : public Template {
 public:
  const char* name() const override { return "cpu.rms_norm"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    RmsCall f;
    if (!handles(c, f)) return {};
    return {{"rows", rows_values(f.g.rows, f.g.cols)}, {"split", split_values(f.g.rows, f.g.cols)},
            {"acc", kOnOff}, {"unroll", kUnroll}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    RmsCall f;
    if (!handles(c, f)) return unsupported("cpu.rms_norm does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    const int64_t split = k->at("split");
    const std::string chunk = str(std::max<int64_t>(split, 1));
    std::string src = head(name(), std::string(dtype_name(f.g.dt)) + " weight=" + (f.g.weighted ? "yes" : "no"),
                           k.value()) +
                      rms_cpu_prelude(f, k.value()) + replace_all(kRowFns, "@IVDEP@", ivdep(simd));
    auto common = [&](Args& a) {
      a.restrict_ptrs = simd;
      a.ptr("kc_x_t*", "out", "out0");
      a.ptr("float*", "rstd", "out1");
      a.ptr("const kc_x_t*", "in", "input");
      if (f.g.weighted) a.ptr("const kc_x_t*", "w", "weight");
      else a.nullptr_decl("const kc_x_t*", "w");
    };
    Args a, p, q;
    common(a);
    a.i64("rows", kRowsExpr);
    a.i64("n", kColsExpr);
    a.f64("eps", "eps");
    src += kernel("kc_cpu_rms_norm_rows", a, kRowsBody);
    p.restrict_ptrs = simd;
    p.ptr("double*", "part", "kc_part");
    p.ptr("const kc_x_t*", "in", "input");
    p.i64("n", kColsExpr);
    p.i64("chunk", chunk);
    src += kernel("kc_cpu_rms_norm_part", p, kPartBody);
    common(q);
    q.ptr("const double*", "part", "kc_part");
    q.i64("n", kColsExpr);
    q.i64("chunk", chunk);
    q.f64("eps", "eps");
    src += kernel("kc_cpu_rms_norm_apply", q, kApplyBody);
    json ls = json::array(), scratch;
    if (split == 0) {
      const int64_t per = k->at("rows");
      ls.push_back(launch("kc_cpu_rms_norm_rows", "ceil_div(" + std::string(kRowsExpr) + ", " + str(per) + ")", per, a.spec));
    } else {
      const std::string chunks = std::string(kRowsExpr) + " * ceil_div(" + kColsExpr + ", " + chunk + ")";
      ls.push_back(launch("kc_cpu_rms_norm_part", chunks, split, p.spec));
      ls.push_back(launch("kc_cpu_rms_norm_apply", chunks, split, q.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", chunks + " * 8"}}});
    }
    return candidate(name(), k.value(), std::move(src), std::move(ls), std::move(scratch));
  }

 private:
  static bool handles(const OpCall& c, RmsCall& f) {
    return rms_call(c, BackendKind::kCpu, OpFamily::kRmsNorm, f) && rms_cpu_dtypes(f);
  }
};

}  // namespace

std::string rms_cpu_prelude(const RmsCall& f, const Knobs& k) {
  return cpu_tpl::bf16_conversions() + "typedef " + cpu_tpl::elem_type(f.g.dt) + " kc_x_t;\n#define KC_HAS_W " +
         (f.g.weighted ? "1" : "0") + "\n" + cpu_tpl::accumulators(k.at("acc") != 0);
}

const Template* cpu_rms_norm_template() {
  static const RmsNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
