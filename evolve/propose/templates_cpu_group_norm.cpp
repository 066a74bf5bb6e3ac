// CPU group norm template: cpu.group_norm (native_group_norm forward, fp32).
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
//
// Rows are (n, g): numel(out1) rows of n = C / group * HxW contiguous elements, each made of
// C / group channel planes. Knobs: rows (rows per block), split (0: whole rows; else a row is cut
// into chunks of this many elements: partial moments into scratch, then a second launch combines
// them in chunk order (Chan) and normalizes its chunk), unroll (independent accumulator lanes),
// simd (restrict + ivdep on the normalize loop). Moments are two-pass in double; the normalize
// applies y = x * a + b' per channel with a = rstd * w[c], b' = b[c] - mean * a.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// Mean and sum of squared deviations of x[0, n), two passes with KC_U double lanes (fixed order).
const char* kGnMoments = R"K(static inline void kc_moments(const float* KC_RS x, int64_t n, double* mean, double* m2) {
  double s[KC_U] = {}, q[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) s[u] += x[j + u];
  for (; j < n; ++j) s[0] += x[j];
  double t = 0;
  for (int u = 0; u < KC_U; ++u) t += s[u];
  const double mu = t / (double)n;
  for (j = 0; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const double d = x[j + u] - mu;
      q[u] += d * d;
    }
  for (; j < n; ++j) q[0] += (x[j] - mu) * (x[j] - mu);
  t = 0;
  for (int u = 0; u < KC_U; ++u) t += q[u];
  *mean = mu;
  *m2 = t;
}
)K";

// Normalizes elements [j0, j1) of a row whose first channel is ch0, one channel plane at a time
// (a and b' are per channel).
const char* kGnNormalizeHead = R"K(static inline void kc_normalize(const float* KC_RS x, float* KC_RS y, const float* w,
    const float* bb, int64_t ch0, int64_t hw, int64_t j0, int64_t j1, double mean, double rstd) {
  (void)w;
  (void)bb;
  while (j0 < j1) {
    const int64_t cl = j0 / hw, e = (cl + 1) * hw < j1 ? (cl + 1) * hw : j1;
    const float a = (float)(rstd * KC_W(ch0 + cl));
    const float b = (float)(KC_B(ch0 + cl) - mean * (double)a);
)K";

class GroupNormTemplate : public Template {
 public:
  const char* name() const override { return "cpu.group_norm"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    return {{"rows", rows_values(r.rows, r.n)}, {"split", split_values(r.rows, r.n)}, {"unroll", kUnroll},
            {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool has_w = defined_input(c, "weight") != nullptr, has_b = defined_input(c, "bias") != nullptr;
    const bool simd = k->at("simd") != 0;
    std::string src = head(name(), std::string("native_group_norm weight=") + (has_w ? "yes" : "no") +
                                        " bias=" + (has_b ? "yes" : "no"), k.value());
    src += std::string("#define KC_W(c) ") + (has_w ? "(double)w[c]" : "1.0") + "\n";
    src += std::string("#define KC_B(c) ") + (has_b ? "(double)bb[c]" : "0.0") + "\n";
    src += kGnMoments;
    src += kGnNormalizeHead + ivdep(simd) + "    for (int64_t j = j0; j < e; ++j) y[j] = x[j] * a + b;\n    j0 = e;\n  }\n}\n";
    json launches = json::array(), scratch;
    src += kernels(has_w, has_b, simd, k->at("split"), k->at("rows"), launches, scratch);
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  // The entries' text, and the launches of this setting.
  static std::string kernels(bool has_w, bool has_b, bool simd, int64_t split, int64_t per, json& launches,
                             json& scratch) {
    const std::string n_expr = "C / group * HxW", chunk = str(std::max<int64_t>(split, 1));
    auto common = [&](Args& x) {
      x.restrict_ptrs = simd;
      x.ptr("float*", "out", "out0");
      x.ptr("float*", "mean_out", "out1");
      x.ptr("float*", "rstd_out", "out2");
      x.ptr("const float*", "in", "input");
      if (has_w) x.ptr("const float*", "w", "weight");
      else x.nullptr_decl("const float*", "w");
      if (has_b) x.ptr("const float*", "bb", "bias");
      else x.nullptr_decl("const float*", "bb");
      x.i64("rows", "numel(out1)");
      x.i64("groups", "group");
      x.i64("hw", "HxW");
      x.i64("n", n_expr);
    };
    // A block is a range of whole rows.
    Args a;
    common(a);
    a.f64("eps", "eps");
    std::string src = kernel("kc_cpu_group_norm_rows", a, R"K(  const int64_t per = ctx->block[0], cpg = n / hw;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      double mean, m2;
      kc_moments(in + r * n, n, &mean, &m2);
      const double rstd = 1.0 / sqrt(m2 / (double)n + eps);
      mean_out[r] = (float)mean;
      rstd_out[r] = (float)rstd;
      kc_normalize(in + r * n, out + r * n, w, bb, (r % groups) * cpg, hw, 0, n, mean, rstd);
    }
  }
)K");
    // Split rows: partial moments per chunk, then every chunk combines its row's partials.
    Args p;
    src += moments_part_kernel("kc_cpu_group_norm_part", n_expr, chunk, simd, p);
    Args q;
    common(q);
    q.ptr("const double*", "part", "kc_part");
    q.i64("chunk", chunk);
    q.f64("eps", "eps");
    src += kernel("kc_cpu_group_norm_apply", q, R"K(  const int64_t nc = (n + chunk - 1) / chunk, cpg = n / hw;
  (void)rows;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, c = b % nc, j0 = c * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double cnt = 0, mean = 0, m2 = 0;
    for (int64_t i = 0; i < nc; ++i) {   /* Chan et al., in chunk order: every chunk agrees */
      const double nb = (double)((i + 1) * chunk < n ? chunk : n - i * chunk);
      const double mb = part[2 * (r * nc + i)], qb = part[2 * (r * nc + i) + 1];
      const double tot = cnt + nb, d = mb - mean;
      mean += d * (nb / tot);
      m2 += qb + d * d * (cnt * nb / tot);
      cnt = tot;
    }
    const double rstd = 1.0 / sqrt(m2 / (double)n + eps);
    if (c == 0) {
      mean_out[r] = (float)mean;
      rstd_out[r] = (float)rstd;
    }
    kc_normalize(in + r * n, out + r * n, w, bb, (r % groups) * cpg, hw, j0, j1, mean, rstd);
  }
)K");
    if (split == 0) {
      launches.push_back(launch("kc_cpu_group_norm_rows", "ceil_div(numel(out1), " + str(per) + ")", per, a.spec));
    } else {
      const std::string chunks = "numel(out1) * ceil_div(" + n_expr + ", " + str(split) + ")";
      launches.push_back(launch("kc_cpu_group_norm_part", chunks, split, p.spec));
      launches.push_back(launch("kc_cpu_group_norm_apply", chunks, split, q.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", chunks + " * 16"}}});
    }
    return src;
  }

  bool handles(const OpCall& c, Rows& r) const {
    if (c.op != OpId::kGroupNorm || !dense_f32(c) || c.outputs.size() != 3) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || x->numel() <= 0 || !c.scalar("eps")) return false;
    const int64_t N = c.int_arg("N", 0), C = c.int_arg("C", 0), hw = c.int_arg("HxW", 0), g = c.int_arg("group", 0);
    if (N <= 0 || C <= 0 || hw <= 0 || g <= 0 || C % g != 0 || N * C * hw != x->numel()) return false;
    for (const char* wb : {"weight", "bias"})
      if (const TensorMeta* t = defined_input(c, wb); t && t->numel() != C) return false;
    if (!c.outputs[0].defined || c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (!c.outputs[i].defined || c.outputs[i].numel() != N * g) return false;
    r.rows = N * g;
    r.n = C / g * hw;
    return true;
  }
};

}  // namespace

const Template* cpu_group_norm_template() {
  static const GroupNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
