// CPU layer norm template: cpu.layer_norm.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Layer norm: rows of n = prod(normalized_shape) elements.

// Mean and sum of squared deviations of x[0, n) (n >= 1): two-pass (mean, then deviations
// from it) or a one-pass sum of (x - x[0]) and its squares in double.
const char* kMoments = R"K(static inline void kc_moments(const float* KC_RS x, int64_t n, double* mean, double* m2) {
#if KC_ONEPASS
  const double k = x[0];
  double s1[KC_U] = {}, s2[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const double d = (double)x[j + u] - k;
      s1[u] += d;
      s2[u] += d * d;
    }
  for (; j < n; ++j) {
    const double d = (double)x[j] - k;
    s1[0] += d;
    s2[0] += d * d;
  }
  double t1 = 0, t2 = 0;
  for (int u = 0; u < KC_U; ++u) {
    t1 += s1[u];
    t2 += s2[u];
  }
  *mean = k + t1 / (double)n;
  const double q = t2 - t1 * (t1 / (double)n);
  *m2 = q < 0 ? 0 : q;
#else
  kc_sum s[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) s[u].add(x[j + u]);
  for (; j < n; ++j) s[0].add(x[j]);
  const double mu = kc_total(s) / (double)n;
  const float mf = (float)mu;
  (void)mf;
  kc_sum q[KC_U] = {};
  j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const kc_acc_t d = KC_DEV(x[j + u], mu, mf);
      q[u].add(d * d);
    }
  for (; j < n; ++j) {
    const kc_acc_t d = KC_DEV(x[j], mu, mf);
    q[0].add(d * d);
  }
  *mean = mu;
  *m2 = kc_total(q);
#endif
}
)K";

class LayerNormTemplate : public Template {
 public:
  const char* name() const override { return "cpu.layer_norm"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    return {{"rows", rows_values(r.rows, r.n)}, {"split", split_values(r.rows, r.n)}, {"stats", {0, 1}},
            {"acc", kOnOff}, {"unroll", kUnroll}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool acc_double = k->at("acc") != 0, onepass = k->at("stats") != 0, simd = k->at("simd") != 0;
    if (onepass && !acc_double) return unsupported("the one-pass moments need double accumulation");
    const bool has_w = defined_input(c, "weight") != nullptr, has_b = defined_input(c, "bias") != nullptr;
    const int64_t split = k->at("split");
    const std::string chunk = str(std::max<int64_t>(split, 1));

    std::string src = head(name(), std::string("native_layer_norm weight=") + (has_w ? "yes" : "no") +
                                        " bias=" + (has_b ? "yes" : "no"), k.value());
    src += "#define KC_ONEPASS " + str(onepass ? 1 : 0) + "\n";
    src += acc_double ? "#define KC_DEV(x, md, mf) ((double)(x) - (md))\n" : "#define KC_DEV(x, md, mf) ((x) - (mf))\n";
    src += accumulators(acc_double);
    src += kMoments;
    std::string affine = "(x[j] - mf) * rf";
    if (has_w) affine = "(" + affine + ") * w[j]";
    if (has_b) affine += " + bb[j]";
    src += "static inline void kc_normalize(const float* KC_RS x, float* KC_RS y, const float* KC_RS w,\n"
           "                                const float* KC_RS bb, int64_t j0, int64_t j1, float mf, float rf) {\n"
           "  (void)w;\n  (void)bb;\n" +
           ivdep(simd) + "  for (int64_t j = j0; j < j1; ++j) y[j] = " + affine + ";\n}\n";

    const std::string n_expr = "numel(input) / numel(out1)";
    // The row kernel: a block is a range of whole rows.
    Args a;
    a.restrict_ptrs = simd;
    auto common = [&](Args& x) {
      x.ptr("float*", "out", "out0");
      x.ptr("float*", "mean_out", "out1");
      x.ptr("float*", "rstd_out", "out2");
      x.ptr("const float*", "in", "input");
      if (has_w) x.ptr("const float*", "w", "weight");
      else x.nullptr_decl("const float*", "w");
      if (has_b) x.ptr("const float*", "bb", "bias");
      else x.nullptr_decl("const float*", "bb");
    };
    common(a);
    a.i64("rows", "numel(out1)");
    a.i64("n", n_expr);
    a.f64("eps", "eps");
    src += kernel("kc_cpu_layer_norm_rows", a, R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      double mean, m2;
      kc_moments(in + r * n, n, &mean, &m2);
      const double rstd = 1.0 / sqrt(m2 / (double)n + eps);
      mean_out[r] = (float)mean;
      rstd_out[r] = (float)rstd;
      kc_normalize(in + r * n, out + r * n, w, bb, 0, n, (float)mean, (float)rstd);
    }
  }
)K");
    // Split rows: partial moments per chunk, then every chunk combines its row's partials in the
    // same order (so all chunks agree) and normalizes itself.
    Args p;
    src += moments_part_kernel("kc_cpu_layer_norm_part", n_expr, chunk, simd, p);
    Args q;
    q.restrict_ptrs = simd;
    common(q);
    q.ptr("const double*", "part", "kc_part");
    q.i64("n", n_expr);
    q.i64("chunk", chunk);
    q.f64("eps", "eps");
    src += kernel("kc_cpu_layer_norm_apply", q, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, c = b % nc, j0 = c * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double cnt = 0, mean = 0, m2 = 0;
    for (int64_t i = 0; i < nc; ++i) {   /* Chan et al., in chunk order */
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
    kc_normalize(in + r * n, out + r * n, w, bb, j0, j1, (float)mean, (float)rstd);
  }
)K");

    json launches = json::array(), scratch;
    if (split == 0) {
      const int64_t per = k->at("rows");
      launches.push_back(launch("kc_cpu_layer_norm_rows", "ceil_div(numel(out1), " + str(per) + ")", per, a.spec));
    } else {
      const std::string chunks = "numel(out1) * ceil_div(" + n_expr + ", " + str(split) + ")";
      launches.push_back(launch("kc_cpu_layer_norm_part", chunks, split, p.spec));
      launches.push_back(launch("kc_cpu_layer_norm_apply", chunks, split, q.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", chunks + " * 16"}}});
    }
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  bool handles(const OpCall& c, Rows& r) const {
    if (c.op != OpId::kLayerNorm || !dense_f32(c) || c.outputs.size() != 3) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || !ln_rows(c, *x, r)) return false;
    for (const char* wb : {"weight", "bias"})
      if (const TensorMeta* t = defined_input(c, wb); t && t->numel() != r.n) return false;
    if (!c.outputs[0].defined || c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (!c.outputs[i].defined || c.outputs[i].numel() != r.rows) return false;
    return c.scalar("eps") != nullptr;
  }
};

}  // namespace

const Template* cpu_layer_norm_template() {
  static const LayerNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
