// CPU layer norm templates, forward and backward: cpu.layer_norm, cpu.layer_norm_backward.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
#include "evolve/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Layer norm: rows of n = prod(normalized_shape) elements.

// Rows and row length of a layer-norm call; false when shapes do not fit together.
bool ln_rows(const OpCall& c, const TensorMeta& x, Rows& r) {
  const std::vector<int64_t> ns = c.list_arg("normalized_shape");
  if (ns.size() > x.sizes.size()) return false;
  const size_t axis = x.sizes.size() - ns.size();
  int64_t n = 1;
  for (size_t i = 0; i < ns.size(); ++i) {
    if (x.sizes[axis + i] != ns[i]) return false;
    n *= ns[i];
  }
  if (n <= 0 || x.numel() <= 0) return false;
  r.n = n;
  r.rows = x.numel() / n;
  return true;
}

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
  const char* backend() const override { return "cpu"; }

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
    p.restrict_ptrs = simd;
    p.ptr("double*", "part", "kc_part");
    p.ptr("const float*", "in", "input");
    p.i64("n", n_expr);
    p.i64("chunk", chunk);
    src += kernel("kc_cpu_layer_norm_part", p, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    kc_moments(in + r * n + j0, j1 - j0, &part[2 * b], &part[2 * b + 1]);
  }
)K");
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

// ---------------------------------------------------------------------------------------------
// Layer norm backward.

class LayerNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.layer_norm_backward"; }
  const char* backend() const override { return "cpu"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    std::vector<KnobDim> s;
    if (c.outputs[0].defined) {
      s.push_back({"rows", rows_values(r.rows, r.n)});
      s.push_back({"split", split_values(r.rows, r.n)});
    }
    if (c.outputs[1].defined || c.outputs[2].defined) {
      // Row slabs for partial column sums: at least two slabs and at most 64 MiB of partials.
      std::vector<int64_t> wb = {0};
      for (int64_t rs : {16, 64, 256}) {
        const int64_t slabs = (r.rows + rs - 1) / rs;
        if (slabs >= 2 && slabs * r.n * 16 <= (int64_t{64} << 20)) wb.push_back(rs);
      }
      // Column blocks keep threads busy when rows are long; short rows with many of them want slabs.
      int64_t dflt = 0;
      if (r.n < 4096 && r.rows >= 256 && std::find(wb.begin(), wb.end(), 64) != wb.end()) dflt = 64;
      s.push_back({"wb_rows", default_first(wb, dflt)});
      s.push_back({"wb_cols", {256, 64, 1024}});
    }
    s.push_back({"acc", kOnOff});
    s.push_back({"unroll", kUnroll});
    s.push_back({"simd", kOnOff});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool acc_double = k->at("acc") != 0, simd = k->at("simd") != 0;
    const bool has_w = defined_input(c, "weight") != nullptr;
    const bool dx = c.outputs[0].defined, dw = c.outputs[1].defined, db = c.outputs[2].defined;
    const std::string n_expr = "numel(input) / numel(mean)";

    std::string src = head(name(), std::string("native_layer_norm_backward weight=") + (has_w ? "yes" : "no") +
                                        " grads=" + (dx ? "x" : "") + (dw ? "w" : "") + (db ? "b" : ""),
                           k.value());
    src += accumulators(acc_double);
    json launches = json::array(), scratch = json::array();

    if (dx) {
      const std::string wg = has_w ? "(kc_acc_t)g[j] * (kc_acc_t)w[j]" : "(kc_acc_t)g[j]";
      const std::string wgf = has_w ? "g[j] * w[j]" : "g[j]";
      // Row sums a = sum(w g), b = sum(w g xhat) over [j0, j1).
      src += replace_all(R"K(static inline void kc_dx_sums(const float* KC_RS g, const float* KC_RS x, const float* KC_RS w,
                              int64_t j0, int64_t j1, float mf, float rf, double* a, double* b) {
  (void)w;
  kc_sum sa[KC_U] = {}, sb[KC_U] = {};
  int64_t j = j0;
  for (; j + KC_U <= j1; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const int64_t jj = j + u;
      const kc_acc_t wg = @WG@;
      const kc_acc_t xh = ((kc_acc_t)x[jj] - (kc_acc_t)mf) * (kc_acc_t)rf;
      sa[u].add(wg);
      sb[u].add(wg * xh);
    }
  for (; j < j1; ++j) {
    const int64_t jj = j;
    const kc_acc_t wg = @WG@;
    const kc_acc_t xh = ((kc_acc_t)x[jj] - (kc_acc_t)mf) * (kc_acc_t)rf;
    sa[0].add(wg);
    sb[0].add(wg * xh);
  }
  *a = kc_total(sa);
  *b = kc_total(sb);
}
)K",
                         "@WG@", replace_all(wg, "[j]", "[jj]"));
      src += "static inline void kc_dx_apply(const float* KC_RS g, const float* KC_RS x, const float* KC_RS w,\n"
             "                               float* KC_RS o, int64_t j0, int64_t j1, float mf, float rf, float ma,\n"
             "                               float mb) {\n"
             "  (void)w;\n" +
             ivdep(simd) +
             "  for (int64_t j = j0; j < j1; ++j) {\n"
             "    const float xh = (x[j] - mf) * rf;\n"
             "    o[j] = rf * ((" + wgf + ") - ma - xh * mb);\n"
             "  }\n"
             "}\n";
      auto common = [&](Args& x) {
        x.restrict_ptrs = simd;
        x.ptr("float*", "dx", "out0");
        x.ptr("const float*", "go", "grad_out");
        x.ptr("const float*", "in", "input");
        x.ptr("const float*", "mean", "mean");
        x.ptr("const float*", "rstd", "rstd");
        if (has_w) x.ptr("const float*", "w", "weight");
        else x.nullptr_decl("const float*", "w");
      };
      Args a;
      common(a);
      a.i64("rows", "numel(mean)");
      a.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_dx_rows", a, R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* g = go + r * n;
      const float* x = in + r * n;
      double sa, sb;
      kc_dx_sums(g, x, w, 0, n, mean[r], rstd[r], &sa, &sb);
      kc_dx_apply(g, x, w, dx + r * n, 0, n, mean[r], rstd[r], (float)(sa / (double)n), (float)(sb / (double)n));
    }
  }
)K");
      const int64_t split = k->at("split");
      Args p;
      p.restrict_ptrs = simd;
      p.ptr("double*", "part", "kc_dx_part");
      p.ptr("const float*", "go", "grad_out");
      p.ptr("const float*", "in", "input");
      p.ptr("const float*", "mean", "mean");
      p.ptr("const float*", "rstd", "rstd");
      if (has_w) p.ptr("const float*", "w", "weight");
      else p.nullptr_decl("const float*", "w");
      p.i64("n", n_expr);
      p.i64("chunk", str(std::max<int64_t>(split, 1)));
      src += kernel("kc_cpu_lnb_dx_part", p, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    kc_dx_sums(go + r * n, in + r * n, w, j0, j1, mean[r], rstd[r], &part[2 * b], &part[2 * b + 1]);
  }
)K");
      Args q;
      common(q);
      q.ptr("const double*", "part", "kc_dx_part");
      q.i64("n", n_expr);
      q.i64("chunk", str(std::max<int64_t>(split, 1)));
      src += kernel("kc_cpu_lnb_dx_apply", q, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < nc; ++i) {
      sa += part[2 * (r * nc + i)];
      sb += part[2 * (r * nc + i) + 1];
    }
    kc_dx_apply(go + r * n, in + r * n, w, dx + r * n, j0, j1, mean[r], rstd[r], (float)(sa / (double)n),
                (float)(sb / (double)n));
  }
)K");
      if (split == 0) {
        const int64_t per = k->at("rows");
        launches.push_back(launch("kc_cpu_lnb_dx_rows", "ceil_div(numel(mean), " + str(per) + ")", per, a.spec));
      } else {
        const std::string chunks = "numel(mean) * ceil_div(" + n_expr + ", " + str(split) + ")";
        launches.push_back(launch("kc_cpu_lnb_dx_part", chunks, split, p.spec));
        launches.push_back(launch("kc_cpu_lnb_dx_apply", chunks, split, q.spec));
        scratch.push_back({{"name", "kc_dx_part"}, {"bytes", chunks + " * 16"}});
      }
    }

    if (dw || db) {
      src += "#define KC_DW " + str(dw ? 1 : 0) + "\n#define KC_DB " + str(db ? 1 : 0) + "\n#define KC_WB_MAX 1024\n";
      auto outs = [&](Args& x) {
        if (dw) x.ptr("float*", "dw", "out1");
        else x.nullptr_decl("float*", "dw");
        if (db) x.ptr("float*", "db", "out2");
        else x.nullptr_decl("float*", "db");
      };
      auto ins = [&](Args& x) {
        x.ptr("const float*", "go", "grad_out");
        x.ptr("const float*", "in", "input");
        x.ptr("const float*", "mean", "mean");
        x.ptr("const float*", "rstd", "rstd");
      };
      // Column-blocked: a block owns columns [j0, j1) and walks every row in order.
      Args a;
      a.restrict_ptrs = simd;
      outs(a);
      ins(a);
      a.i64("rows", "numel(mean)");
      a.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_wb_cols", a, R"K(  (void)dw;
  (void)db;
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t b0 = b * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t j0 = b0; j0 < b1; j0 += KC_WB_MAX) {
      const int64_t j1 = j0 + KC_WB_MAX < b1 ? j0 + KC_WB_MAX : b1;
      kc_sum sw[KC_WB_MAX], sb[KC_WB_MAX];
      for (int64_t j = 0; j < j1 - j0; ++j) sw[j] = sb[j] = kc_sum{};
      for (int64_t r = 0; r < rows; ++r) {
        const float* KC_RS g = go + r * n;
        const float* KC_RS x = in + r * n;
        const kc_acc_t mf = mean[r], rf = rstd[r];
        (void)x;
        (void)mf;
        (void)rf;
        for (int64_t j = j0; j < j1; ++j) {
#if KC_DW
          sw[j - j0].add((kc_acc_t)g[j] * (((kc_acc_t)x[j] - mf) * rf));
#endif
#if KC_DB
          sb[j - j0].add(g[j]);
#endif
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
#if KC_DW
        dw[j] = (float)sw[j - j0].get();
#endif
#if KC_DB
        db[j] = (float)sb[j - j0].get();
#endif
      }
    }
  }
)K");
      // Row slabs: slab s sums its rows into part[s][0..n) (weight) and part[s][n..2n) (bias), in
      // double; the finishing launch adds the slabs in order.
      Args p;
      p.restrict_ptrs = simd;
      p.ptr("double*", "part", "kc_wb_part");
      ins(p);
      p.i64("rows", "numel(mean)");
      p.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_wb_part", p, std::string(R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    double* KC_RS pw = part + b * 2 * n;
    double* KC_RS pb = pw + n;
    for (int64_t j = 0; j < n; ++j) pw[j] = pb[j] = 0;
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* KC_RS g = go + r * n;
      const float* KC_RS x = in + r * n;
      const double mf = mean[r], rf = rstd[r];
      (void)x;
      (void)mf;
      (void)rf;
)K") + ivdep(simd) + R"K(      for (int64_t j = 0; j < n; ++j) {
#if KC_DW
        pw[j] += (double)g[j] * (((double)x[j] - mf) * rf);
#endif
#if KC_DB
        pb[j] += (double)g[j];
#endif
      }
    }
  }
)K");
      Args f;
      f.restrict_ptrs = simd;
      outs(f);
      f.ptr("const double*", "part", "kc_wb_part");
      const int64_t wb_rows = k->at("wb_rows"), cols = k->at("wb_cols");
      const std::string slabs = "ceil_div(numel(mean), " + str(std::max<int64_t>(wb_rows, 1)) + ")";
      f.i64("slabs", slabs);
      f.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_wb_finish", f, R"K(  (void)dw;
  (void)db;
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t b0 = b * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t j0 = b0; j0 < b1; j0 += KC_WB_MAX) {
      const int64_t j1 = j0 + KC_WB_MAX < b1 ? j0 + KC_WB_MAX : b1;
      double sw[KC_WB_MAX], sb[KC_WB_MAX];
      for (int64_t j = 0; j < j1 - j0; ++j) sw[j] = sb[j] = 0;
      for (int64_t s = 0; s < slabs; ++s) {
        const double* KC_RS pw = part + s * 2 * n;
        const double* KC_RS pb = pw + n;
        for (int64_t j = j0; j < j1; ++j) {
          sw[j - j0] += pw[j];
          sb[j - j0] += pb[j];
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
#if KC_DW
        dw[j] = (float)sw[j - j0];
#endif
#if KC_DB
        db[j] = (float)sb[j - j0];
#endif
      }
    }
  }
)K");
      const std::string col_grid = "ceil_div(" + n_expr + ", " + str(cols) + ")";
      if (wb_rows == 0) {
        launches.push_back(launch("kc_cpu_lnb_wb_cols", col_grid, cols, a.spec));
      } else {
        launches.push_back(launch("kc_cpu_lnb_wb_part", slabs, wb_rows, p.spec));
        launches.push_back(launch("kc_cpu_lnb_wb_finish", col_grid, cols, f.spec));
        scratch.push_back({{"name", "kc_wb_part"}, {"bytes", slabs + " * " + n_expr + " * 16"}});
      }
    }
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  bool handles(const OpCall& c, Rows& r) const {
    if (c.op != OpId::kLayerNormBackward || !dense_f32(c) || c.outputs.size() != 3) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || !ln_rows(c, *x, r)) return false;
    if (!same_sizes(x, defined_input(c, "grad_out"))) return false;
    for (const char* s : {"mean", "rstd"}) {
      const TensorMeta* t = defined_input(c, s);
      if (!t || t->numel() != r.rows) return false;
    }
    if (const TensorMeta* w = defined_input(c, "weight"); w && w->numel() != r.n) return false;
    if (c.outputs[0].defined && c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (c.outputs[i].defined && c.outputs[i].numel() != r.n) return false;
    return c.outputs[0].defined || c.outputs[1].defined || c.outputs[2].defined;
  }
};


}  // namespace

const Template* cpu_layer_norm_template(bool backward) {
  static const LayerNormTemplate fwd;
  static const LayerNormBackwardTemplate bwd;
  return backward ? static_cast<const Template*>(&bwd) : &fwd;
}

}  // namespace kc::evolve
