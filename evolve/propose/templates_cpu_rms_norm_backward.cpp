// CPU fused RMSNorm backward (cpu.rms_norm_backward): grad_input and/or grad_weight of
// kernelcraft::rms_norm from the forward's rstd, f32 or bf16, weight present or absent, any
// output_mask (evolve/ops/rms_norm.h has the formulas). Part of the CPU op-family templates
// (overview in templates_cpu.cpp).
//
// grad_input: a row's sum of a_j xhat_j (a = grad w, xhat = x rstd, both fp32) in KC_U lanes
// (knob acc), then each element rstd (a - xhat sum / K) once; blocks of `rows` rows, or (split)
// chunks of long rows whose partial sums every chunk adds in chunk order. grad_weight, in a fixed
// order whatever the threading: column blocks of wb_cols columns walking every row (wb_rows=0),
// or double partials per slab of wb_rows rows and a launch adding the slabs in order; with both
// outputs, fuse=1 has the grad_input pass write the slab partials, so grad and input are read once.
#include "evolve/propose/templates_cpu_common.h"
#include "evolve/propose/templates_rms_norm.h"

namespace kc::evolve {

std::string rms_cpu_prelude(const RmsCall& f, const Knobs& k);

namespace {

using namespace cpu_tpl;
using nlohmann::json;

const char* kRowsExpr = "numel(rstd)";
const char* kColsExpr = "numel(input) / numel(rstd)";

// a_j, xhat_j; the row sum of a xhat over [j0, j1); grad_input of [j0, j1) given m = sum / K, the
// fused variant adding grad xhat to a slab's partials pw as well.
const char* kDxFns = R"K(#define KC_A(j) (KC_HAS_W ? kc_f(g[j]) * kc_f(w[j]) : kc_f(g[j]))
static inline double kc_dot(const kc_x_t* KC_RS g, const kc_x_t* KC_RS x, const kc_x_t* KC_RS w, int64_t j0,
                            int64_t j1, float rf) {
  (void)w;
  kc_sum s[KC_U] = {};
  int64_t j = j0;
  for (; j + KC_U <= j1; j += KC_U)
    for (int u = 0; u < KC_U; ++u) s[u].add((kc_acc_t)KC_A(j + u) * (kc_acc_t)(kc_f(x[j + u]) * rf));
  for (; j < j1; ++j) s[0].add((kc_acc_t)KC_A(j) * (kc_acc_t)(kc_f(x[j]) * rf));
  return kc_total(s);
}
static inline void kc_dx(const kc_x_t* KC_RS g, const kc_x_t* KC_RS x, const kc_x_t* KC_RS w, kc_x_t* KC_RS o,
                         int64_t j0, int64_t j1, float rf, float m) {
  (void)w;
@IVDEP@  for (int64_t j = j0; j < j1; ++j) kc_put(o + j, rf * (KC_A(j) - (kc_f(x[j]) * rf) * m));
}
static inline void kc_dx_dw(const kc_x_t* KC_RS g, const kc_x_t* KC_RS x, const kc_x_t* KC_RS w, kc_x_t* KC_RS o,
                            double* KC_RS pw, int64_t n, float rf, float m) {
  (void)w;
@IVDEP@  for (int64_t j = 0; j < n; ++j) {
    const float xh = kc_f(x[j]) * rf;
    kc_put(o + j, rf * (KC_A(j) - xh * m));
    pw[j] += (double)kc_f(g[j]) * (double)xh;
  }
}
)K";

const char* kDxRowsBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const kc_x_t *g = go + r * n, *x = in + r * n;
      const float m = (float)(kc_dot(g, x, w, 0, n, rstd[r]) / (double)n);
      kc_dx(g, x, w, dx + r * n, 0, n, rstd[r], m);
    }
  }
)K";

const char* kDxPartBody = R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    part[b] = kc_dot(go + r * n, in + r * n, w, j0, j1, rstd[r]);
  }
)K";

const char* kDxApplyBody = R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double s = 0;
    for (int64_t i = 0; i < nc; ++i) s += part[r * nc + i];
    kc_dx(go + r * n, in + r * n, w, dx + r * n, j0, j1, rstd[r], (float)(s / (double)n));
  }
)K";

// Slab b of `per` rows: grad_input of its rows and their grad xhat summed into part[b][0, n).
const char* kFusedBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    double* KC_RS pw = part + b * n;
    for (int64_t j = 0; j < n; ++j) pw[j] = 0;
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const kc_x_t *g = go + r * n, *x = in + r * n;
      const float m = (float)(kc_dot(g, x, w, 0, n, rstd[r]) / (double)n);
      kc_dx_dw(g, x, w, dx + r * n, pw, n, rstd[r], m);
    }
  }
)K";

const char* kDwColsBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t b0 = b * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t j0 = b0; j0 < b1; j0 += KC_WB_MAX) {
      const int64_t j1 = j0 + KC_WB_MAX < b1 ? j0 + KC_WB_MAX : b1;
      kc_sum s[KC_WB_MAX];
      for (int64_t j = 0; j < j1 - j0; ++j) s[j] = kc_sum{};
      for (int64_t r = 0; r < rows; ++r) {
        const kc_x_t *KC_RS g = go + r * n, *KC_RS x = in + r * n;
        const float rf = rstd[r];
        for (int64_t j = j0; j < j1; ++j) s[j - j0].add((kc_acc_t)kc_f(g[j]) * (kc_acc_t)(kc_f(x[j]) * rf));
      }
      for (int64_t j = j0; j < j1; ++j) kc_put(dw + j, (float)s[j - j0].get());
    }
  }
)K";

const char* kDwPartBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    double* KC_RS pw = part + b * n;
    for (int64_t j = 0; j < n; ++j) pw[j] = 0;
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const kc_x_t *KC_RS g = go + r * n, *KC_RS x = in + r * n;
      const float rf = rstd[r];
@IVDEP@      for (int64_t j = 0; j < n; ++j) pw[j] += (double)kc_f(g[j]) * (double)(kc_f(x[j]) * rf);
    }
  }
)K";

const char* kDwFinishBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t b0 = b * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t j0 = b0; j0 < b1; j0 += KC_WB_MAX) {
      const int64_t j1 = j0 + KC_WB_MAX < b1 ? j0 + KC_WB_MAX : b1;
      double s[KC_WB_MAX];
      for (int64_t j = 0; j < j1 - j0; ++j) s[j] = 0;
      for (int64_t sl = 0; sl < slabs; ++sl)
        for (int64_t j = j0; j < j1; ++j) s[j - j0] += part[sl * n + j];
      for (int64_t j = j0; j < j1; ++j) kc_put(dw + j, (float)s[j - j0]);
    }
  }
)K";

// Row slab sizes for the grad_weight partials: at least two slabs and at most 64 MiB of them.
std::vector<int64_t> slab_values(int64_t rows, int64_t n) {
  std::vector<int64_t> v = {0};
  for (int64_t rs : {16, 64, 256}) {
    const int64_t slabs = (rows + rs - 1) / rs;
    if (slabs >= 2 && slabs * n * 8 <= (int64_t{64} << 20)) v.push_back(rs);
  }
  return v;
}

bool has(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// What a render collects: the source and the launches and scratch buffers of the spec.
struct Build {
  std::string src;
  json launches = json::array(), scratch = json::array();
  bool simd = false;
  bool weighted = false;
  // grad, input, rstd and (grad_input's kernels: grad_weight's do not read it) the weight.
  void inputs(Args& a, bool with_w = true) const {
    a.restrict_ptrs = simd;
    a.ptr("const kc_x_t*", "go", "grad");
    a.ptr("const kc_x_t*", "in", "input");
    a.ptr("const float*", "rstd", "rstd");
    if (!with_w) return;
    if (weighted) a.ptr("const kc_x_t*", "w", "weight");
    else a.nullptr_decl("const kc_x_t*", "w");
  }
  std::string slabs(int64_t wb_rows) const {
    return "ceil_div(" + std::string(kRowsExpr) + ", " + str(std::max<int64_t>(wb_rows, 1)) + ")";
  }
};

// The grad_input kernels (rows, split part and apply, and with grad_weight the fused slab pass);
// launches the fused pass (fuse=1) or the row or split kernels.
void add_dx(Build& b, const Knobs& k, bool with_dw, bool fused) {
  const int64_t split = k.at("split");
  const std::string chunk = str(std::max<int64_t>(split, 1));
  auto outs = [&](Args& a) {
    a.ptr("kc_x_t*", "dx", "out0");
    b.inputs(a);
  };
  Args a, p, q;
  outs(a);
  a.i64("rows", kRowsExpr);
  a.i64("n", kColsExpr);
  b.src += kernel("kc_cpu_rmsb_dx_rows", a, kDxRowsBody);
  p.ptr("double*", "part", "kc_dx_part");
  b.inputs(p);
  p.i64("n", kColsExpr);
  p.i64("chunk", chunk);
  b.src += kernel("kc_cpu_rmsb_dx_part", p, kDxPartBody);
  outs(q);
  q.ptr("const double*", "part", "kc_dx_part");
  q.i64("n", kColsExpr);
  q.i64("chunk", chunk);
  b.src += kernel("kc_cpu_rmsb_dx_apply", q, kDxApplyBody);
  if (with_dw) {
    Args fz;
    outs(fz);
    fz.ptr("double*", "part", "kc_dw_part");
    fz.i64("rows", kRowsExpr);
    fz.i64("n", kColsExpr);
    b.src += kernel("kc_cpu_rmsb_fused", fz, kFusedBody);
    if (fused) {
      const int64_t per = k.at("wb_rows");
      b.launches.push_back(launch("kc_cpu_rmsb_fused", b.slabs(per), per, fz.spec));
      return;
    }
  }
  if (split == 0) {
    const int64_t per = k.at("rows");
    b.launches.push_back(launch("kc_cpu_rmsb_dx_rows", "ceil_div(" + std::string(kRowsExpr) + ", " + str(per) + ")", per, a.spec));
    return;
  }
  const std::string chunks = std::string(kRowsExpr) + " * ceil_div(" + kColsExpr + ", " + chunk + ")";
  b.launches.push_back(launch("kc_cpu_rmsb_dx_part", chunks, split, p.spec));
  b.launches.push_back(launch("kc_cpu_rmsb_dx_apply", chunks, split, q.spec));
  b.scratch.push_back({{"name", "kc_dx_part"}, {"bytes", chunks + " * 8"}});
}

// The grad_weight kernels (column blocks, slab partials, the slabs' sum) and their launches.
void add_dw(Build& b, const Knobs& k, bool fused) {
  const int64_t wb_rows = k.at("wb_rows"), cols = k.at("wb_cols");
  b.src += "#define KC_WB_MAX 1024\n";
  Args a, p, f;
  a.ptr("kc_x_t*", "dw", "out1");
  b.inputs(a, false);
  a.i64("rows", kRowsExpr);
  a.i64("n", kColsExpr);
  b.src += kernel("kc_cpu_rmsb_dw_cols", a, kDwColsBody);
  p.ptr("double*", "part", "kc_dw_part");
  b.inputs(p, false);
  p.i64("rows", kRowsExpr);
  p.i64("n", kColsExpr);
  b.src += kernel("kc_cpu_rmsb_dw_part", p, replace_all(kDwPartBody, "@IVDEP@", ivdep(b.simd)));
  f.restrict_ptrs = b.simd;
  f.ptr("kc_x_t*", "dw", "out1");
  f.ptr("const double*", "part", "kc_dw_part");
  f.i64("slabs", b.slabs(wb_rows));
  f.i64("n", kColsExpr);
  b.src += kernel("kc_cpu_rmsb_dw_finish", f, kDwFinishBody);
  const std::string col_grid = "ceil_div(" + std::string(kColsExpr) + ", " + str(cols) + ")";
  if (wb_rows == 0) {
    b.launches.push_back(launch("kc_cpu_rmsb_dw_cols", col_grid, cols, a.spec));
    return;
  }
  if (!fused) b.launches.push_back(launch("kc_cpu_rmsb_dw_part", b.slabs(wb_rows), wb_rows, p.spec));
  b.launches.push_back(launch("kc_cpu_rmsb_dw_finish", col_grid, cols, f.spec));
  b.scratch.push_back({{"name", "kc_dw_part"}, {"bytes", b.slabs(wb_rows) + " * " + kColsExpr + " * 8"}});
}

class RmsNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.rms_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  // Defaults: slabs where column blocks would be few (short rows, many of them); with both
  // outputs, the fused pass wherever rows make at least 16 slabs of 64 to share among threads.
  std::vector<KnobDim> space(const OpCall& c) const override {
    RmsCall f;
    if (!handles(c, f)) return {};
    const int64_t rows = f.g.rows, n = f.g.cols;
    std::vector<KnobDim> s;
    const std::vector<int64_t> split = split_values(rows, n), wb = slab_values(rows, n);
    const bool fuse = f.g.want_input && f.g.want_weight && split.front() == 0 && has(wb, 64) && rows >= 16 * 64;
    if (f.g.want_input) {
      s.push_back({"rows", rows_values(rows, n)});
      s.push_back({"split", split});
    }
    if (f.g.want_weight) {
      s.push_back({"wb_rows", default_first(wb, fuse || (n < 4096 && rows >= 256 && has(wb, 64)) ? 64 : 0)});
      s.push_back({"wb_cols", {256, 64, 1024}});
    }
    if (f.g.want_input && f.g.want_weight && wb.size() > 1) s.push_back({"fuse", {fuse ? 1 : 0, fuse ? 0 : 1}});
    s.push_back({"acc", kOnOff});
    s.push_back({"unroll", kUnroll});
    s.push_back({"simd", kOnOff});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    RmsCall f;
    if (!handles(c, f)) return unsupported("cpu.rms_norm_backward does not handle this call");
    const std::vector<KnobDim> sp = space(c);
    Result<Knobs> k = settle(sp, knobs);
    if (!k.is_ok()) return k.status();
    const bool both = f.g.want_input && f.g.want_weight, fused = k->count("fuse") && k->at("fuse") != 0;
    // The fused pass is the row pass and the slab pass in one: no row split, slabs set its
    // blocks (other `rows` values would repeat the same kernel).
    if (fused && (k->at("split") != 0 || k->at("wb_rows") == 0 || k->at("rows") != sp[0].values.front()))
      return unsupported("fuse=1 needs split=0, wb_rows > 0 and the default rows");
    Build b;
    b.simd = k->at("simd") != 0;
    b.weighted = f.g.weighted;
    b.src = head(name(), std::string(dtype_name(f.g.dt)) + " weight=" + (f.g.weighted ? "yes" : "no") +
                             " grads=" + (f.g.want_input ? "x" : "") + (f.g.want_weight ? "w" : ""),
                 k.value()) +
            rms_cpu_prelude(f, k.value());
    if (f.g.want_input) b.src += replace_all(kDxFns, "@IVDEP@", ivdep(b.simd));
    if (f.g.want_input) add_dx(b, k.value(), both, fused);
    if (f.g.want_weight) add_dw(b, k.value(), fused);
    return candidate(name(), k.value(), std::move(b.src), std::move(b.launches),
                     b.scratch.empty() ? json() : std::move(b.scratch));
  }

 private:
  static bool handles(const OpCall& c, RmsCall& f) {
    return rms_call(c, BackendKind::kCpu, OpFamily::kRmsNormBackward, f) && rms_cpu_dtypes(f);
  }
};

}  // namespace

const Template* cpu_rms_norm_backward_template() {
  static const RmsNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
