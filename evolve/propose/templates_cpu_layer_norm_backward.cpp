// CPU layer norm backward template: cpu.layer_norm_backward.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Layer norm backward.

class LayerNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.layer_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

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

const Template* cpu_layer_norm_backward_template() {
  static const LayerNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
