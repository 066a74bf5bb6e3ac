// CPU group norm backward template: cpu.group_norm_backward (native_group_norm_backward, fp32).
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h; the structure follows cpu.batch_norm_backward's.
//
// A row (n, g) is D = C / group channel planes of HxW contiguous elements with its saved mean and
// rstd. Launch 1 has a block per row sum dy and dy (x - mean) in double over each plane (kept in
// scratch for the channel sums) and write the row's (mean, rstd, rstd sum w dy (x - mean) / K,
// sum w dy / K), K = D x HxW. Launch 2 (grad_weight / grad_bias asked for) has a block per channel
// add its N planes' sums in order of n: grad_bias = sum dy, grad_weight = sum_n rstd sum dy
// (x - mean). Launch 3 writes grad_input `planes` planes a block:
// rstd (w dy - sum w dy / K - (x - mean) rstd k). Every sum has a fixed order (deterministic).
// Knobs: planes, unroll (independent accumulator lanes), simd.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// Sums of dy and dy (x - mu) over [0, n) in KC_U double lanes (fixed order).
const char* kGnbSums = R"K(static inline void kc_sums(const float* KC_RS dy, const float* KC_RS x, int64_t n, double mu,
                           double* s1, double* s2) {
  double a[KC_U] = {}, b[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      a[u] += dy[j + u];
      b[u] += (double)dy[j + u] * ((double)x[j + u] - mu);
    }
  for (; j < n; ++j) {
    a[0] += dy[j];
    b[0] += (double)dy[j] * ((double)x[j] - mu);
  }
  *s1 = 0, *s2 = 0;
  for (int u = 0; u < KC_U; ++u) *s1 += a[u], *s2 += b[u];
}
)K";

struct GnbShape {
  int64_t n = 0, c = 0, hw = 0, group = 0;
  bool has_w = false, gi = false, gw = false, gb = false;
};

class GroupNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.group_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    GnbShape s;
    if (!handles(c, s)) return {};
    return {{"planes", rows_values(s.n * s.c, s.hw)}, {"unroll", kUnroll}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    GnbShape s;
    if (!handles(c, s)) return unsupported("cpu.group_norm_backward does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    std::string src = head(name(), std::string("native_group_norm_backward weight=") + (s.has_w ? "yes" : "no") +
                                        " grads=" + (s.gi ? "i" : "") + (s.gw ? "w" : "") + (s.gb ? "b" : ""),
                           k.value());
    src += std::string("#define KC_W(c) ") + (s.has_w ? "(double)w[c]" : "1.0") + "\n";
    src += kGnbSums;
    json launches = json::array();
    src += kernels(s, simd, k->at("planes"), launches);
    json scratch = json::array({{{"name", "kc_ps"}, {"bytes", "N * C * 16"}}, {{"name", "kc_ss"}, {"bytes", "N * group * 32"}}});
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  static void weight_param(const GnbShape& s, Args& a) {
    if (s.has_w) a.ptr("const float*", "w", "weight");
    else a.nullptr_decl("const float*", "w");
  }

  // The entries' text, and the launches of this setting.
  static std::string kernels(const GnbShape& s, bool simd, int64_t per, json& launches) {
    Args r;
    r.restrict_ptrs = simd;
    r.ptr("double*", "ps", "kc_ps");
    r.ptr("double*", "ss", "kc_ss");
    r.ptr("const float*", "dy", "grad_out");
    r.ptr("const float*", "in", "input");
    r.ptr("const float*", "mean", "mean");
    r.ptr("const float*", "rstd", "rstd");
    weight_param(s, r);
    r.i64("groups", "group");
    r.i64("cpg", "C / group");
    r.i64("hw", "HxW");
    std::string src = kernel("kc_cpu_gnb_rows", r, R"K(  (void)w, (void)groups;   /* read by KC_W only with a weight */
  const double K = (double)cpg * (double)hw;
  for (int64_t row = ctx->begin; row < ctx->end; ++row) {
    const double m = mean[row], rs = rstd[row];
    double sd = 0, sx = 0;
    for (int64_t i = 0; i < cpg; ++i) {
      const int64_t pl = row * cpg + i;   /* n * C + c, since C = groups * cpg */
      kc_sums(dy + pl * hw, in + pl * hw, hw, m, &ps[2 * pl], &ps[2 * pl + 1]);
      sd += KC_W((row % groups) * cpg + i) * ps[2 * pl];
      sx += KC_W((row % groups) * cpg + i) * ps[2 * pl + 1];
    }
    ss[4 * row] = m;
    ss[4 * row + 1] = rs;
    ss[4 * row + 2] = rs * sx / K;
    ss[4 * row + 3] = sd / K;
  }
)K");
    launches.push_back(launch("kc_cpu_gnb_rows", "N * group", 1, r.spec));
    if (s.gw || s.gb) {
      Args q;
      if (s.gw) q.ptr("float*", "gw", "out1");
      else q.nullptr_decl("float*", "gw");
      if (s.gb) q.ptr("float*", "gb", "out2");
      else q.nullptr_decl("float*", "gb");
      q.ptr("const double*", "ps", "kc_ps");
      q.ptr("const float*", "rstd", "rstd");
      q.i64("n", "N");
      q.i64("C", "C");
      q.i64("cpg", "C / group");
      src += kernel("kc_cpu_gnb_wb", q, R"K(  for (int64_t c = ctx->begin; c < ctx->end; ++c) {
    double sd = 0, sx = 0;
    for (int64_t i = 0; i < n; ++i) {
      sd += ps[2 * (i * C + c)];
      sx += (double)rstd[i * (C / cpg) + c / cpg] * ps[2 * (i * C + c) + 1];
    }
    if (gw) gw[c] = (float)sx;
    if (gb) gb[c] = (float)sd;
  }
)K");
      launches.push_back(launch("kc_cpu_gnb_wb", "C", 1, q.spec));
    }
    if (!s.gi) return src;
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("float*", "out", "out0");
    a.ptr("const float*", "dy", "grad_out");
    a.ptr("const float*", "in", "input");
    a.ptr("const double*", "ss", "kc_ss");
    weight_param(s, a);
    a.i64("np", "N * C");
    a.i64("C", "C");
    a.i64("cpg", "C / group");
    a.i64("hw", "HxW");
    src += kernel("kc_cpu_gnb_input", a, std::string(R"K(  (void)w, (void)C;
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t p = b * per; p < (b + 1) * per && p < np; ++p) {
      const int64_t row = p / cpg;
      const float m = (float)ss[4 * row], rs = (float)ss[4 * row + 1], k = (float)ss[4 * row + 2], md = (float)ss[4 * row + 3];
      const float wc = (float)KC_W(p % C);
      float* KC_RS o = out + p * hw;
      const float* KC_RS d = dy + p * hw;
      const float* KC_RS x = in + p * hw;
)K") + ivdep(simd) + "      for (int64_t j = 0; j < hw; ++j) o[j] = rs * (wc * d[j] - md - (x[j] - m) * rs * k);\n    }\n");
    launches.push_back(launch("kc_cpu_gnb_input", "ceil_div(N * C, " + str(per) + ")", per, a.spec));
    return src;
  }

  bool handles(const OpCall& c, GnbShape& s) const {
    if (c.op != OpId::kGroupNormBackward || !dense_f32(c) || c.outputs.size() != 3) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || x->numel() <= 0 || !same_sizes(x, defined_input(c, "grad_out"))) return false;
    s.n = c.int_arg("N", 0), s.c = c.int_arg("C", 0), s.hw = c.int_arg("HxW", 0), s.group = c.int_arg("group", 0);
    if (s.n <= 0 || s.c <= 0 || s.hw <= 0 || s.group <= 0 || s.c % s.group != 0 || s.n * s.c * s.hw != x->numel()) return false;
    for (const char* st : {"mean", "rstd"})
      if (const TensorMeta* t = defined_input(c, st); !t || t->numel() != s.n * s.group) return false;
    const TensorMeta* w = defined_input(c, "weight");
    if (w && w->numel() != s.c) return false;
    s.has_w = w != nullptr;
    s.gi = c.outputs[0].defined, s.gw = c.outputs[1].defined, s.gb = c.outputs[2].defined;
    if ((!s.gi && !s.gw && !s.gb) || ((s.gw || s.gb) && !s.has_w)) return false;
    if (s.gi && c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (c.outputs[i].defined && c.outputs[i].numel() != s.c) return false;
    return true;
  }
};

}  // namespace

const Template* cpu_group_norm_backward_template() {
  static const GroupNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
