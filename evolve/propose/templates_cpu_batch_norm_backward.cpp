// CPU batch norm backward template: cpu.batch_norm_backward (native_batch_norm_backward, fp32).
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h; the layout follows cpu.batch_norm's.
//
// A channel c is N planes of HxW contiguous elements, C planes apart; (mean, invstd) are the
// saved statistics in training, the running ones (1 / sqrt(var + eps)) in eval. Launch 1 (when a
// reduction is needed: training, or grad_weight / grad_bias asked for) has a block per channel sum
// dy and dy (x - mean) in double over the N planes in order (deterministic), write grad_weight /
// grad_bias and (mean, w invstd, mean dy, invstd^2 mean dy (x - mean)) into scratch; launch 2
// writes grad_input `planes` planes a block: w invstd (dy - mean_dy - (x - mean) k) in training,
// dy w invstd in eval. Knobs: planes, unroll (independent accumulator lanes), simd.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// Sums of dy and dy (x - mu) over [0, n) in KC_U double lanes (fixed order).
const char* kBnbSums = R"K(static inline void kc_sums(const float* KC_RS dy, const float* KC_RS x, int64_t n, double mu,
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
  for (int u = 0; u < KC_U; ++u) *s1 += a[u], *s2 += b[u];
}
)K";

struct BnbShape {
  int64_t n = 0, c = 0, hw = 0;
  bool train = true, has_w = false, gi = false, gw = false, gb = false;
  bool reduce() const { return train || gw || gb; }
};

class BatchNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.batch_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    BnbShape s;
    if (!handles(c, s)) return {};
    return {{"planes", rows_values(s.n * s.c, s.hw)}, {"unroll", kUnroll}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    BnbShape s;
    if (!handles(c, s)) return unsupported("cpu.batch_norm_backward does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    std::string src = head(name(), std::string("native_batch_norm_backward ") + (s.train ? "training" : "eval") +
                                        " weight=" + (s.has_w ? "yes" : "no") + " grads=" + (s.gi ? "i" : "") +
                                        (s.gw ? "w" : "") + (s.gb ? "b" : ""), k.value());
    src += std::string("#define KC_W(c) ") + (s.has_w ? "(double)w[c]" : "1.0") + "\n";
    src += s.train ? "#define KC_STAT(c, m, is) const double m = sm[c], is = si[c]\n"
                   : "#define KC_STAT(c, m, is) const double m = rm[c], is = 1.0 / sqrt((double)rv[c] + eps)\n";
    src += kBnbSums;
    json launches = json::array(), scratch;
    src += kernels(s, simd, k->at("planes"), launches, scratch);
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  // The statistics' parameters and the weight (a null local where absent).
  static void stat_params(const BnbShape& s, Args& a) {
    if (s.has_w) a.ptr("const float*", "w", "weight");
    else a.nullptr_decl("const float*", "w");
    if (s.train) {
      a.ptr("const float*", "sm", "save_mean");
      a.ptr("const float*", "si", "save_invstd");
    } else {
      a.ptr("const float*", "rm", "running_mean");
      a.ptr("const float*", "rv", "running_var");
      a.f64("eps", "eps");
    }
  }

  // The entries' text, and the launches of this setting.
  static std::string kernels(const BnbShape& s, bool simd, int64_t per, json& launches, json& scratch) {
    const std::string C = "size(input,1)", HW = "numel(input) / (size(input,0) * size(input,1))";
    const std::string grid = "ceil_div(size(input,0) * size(input,1), " + str(per) + ")";
    std::string src;
    if (s.reduce()) {
      Args r;
      r.restrict_ptrs = simd;
      r.ptr("double*", "ss", "kc_ss");
      if (s.gw) r.ptr("float*", "gw", "out1");
      else r.nullptr_decl("float*", "gw");
      if (s.gb) r.ptr("float*", "gb", "out2");
      else r.nullptr_decl("float*", "gb");
      r.ptr("const float*", "dy", "grad_out");
      r.ptr("const float*", "in", "input");
      stat_params(s, r);
      r.i64("n", "size(input,0)");
      r.i64("C", C);
      r.i64("hw", HW);
      src += kernel("kc_cpu_bnb_reduce", r, R"K(  (void)w;
  for (int64_t c = ctx->begin; c < ctx->end; ++c) {
    KC_STAT(c, m, is);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) kc_sums(dy + (i * C + c) * hw, in + (i * C + c) * hw, hw, m, &s1, &s2);
    const double cnt = (double)n * (double)hw, sx = s2 * is;
    if (gw) gw[c] = (float)sx;
    if (gb) gb[c] = (float)s1;
    ss[4 * c] = m;
    ss[4 * c + 1] = is * KC_W(c);
    ss[4 * c + 2] = s1 / cnt;
    ss[4 * c + 3] = sx / cnt * is;
  }
)K");
      launches.push_back(launch("kc_cpu_bnb_reduce", C, 1, r.spec));
      scratch = json::array({{{"name", "kc_ss"}, {"bytes", C + " * 32"}}});
    }
    if (!s.gi) return src;
    Args q;
    q.restrict_ptrs = simd;
    q.ptr("float*", "out", "out0");
    q.ptr("const float*", "dy", "grad_out");
    if (s.train) {
      q.ptr("const float*", "in", "input");
      q.ptr("const double*", "ss", "kc_ss");
    } else {
      stat_params(s, q);
    }
    q.i64("n", "size(input,0)");
    q.i64("C", C);
    q.i64("hw", HW);
    const std::string loop = std::string(R"K(  const int64_t per = ctx->block[0], np = n * C;
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t p = b * per; p < (b + 1) * per && p < np; ++p) {
      const int64_t c = p % C;
      float* KC_RS o = out + p * hw;
      const float* KC_RS d = dy + p * hw;
)K");
    const std::string body = s.train ? R"K(      const float* KC_RS x = in + p * hw;
      const float m = (float)ss[4 * c], a = (float)ss[4 * c + 1], md = (float)ss[4 * c + 2], k = (float)ss[4 * c + 3];
)K" + ivdep(simd) + "      for (int64_t j = 0; j < hw; ++j) o[j] = a * (d[j] - md - (x[j] - m) * k);\n    }\n"
                                     : std::string(R"K(      KC_STAT(c, m, is);
      (void)m;
      const float a = (float)(is * KC_W(c));
)K") + ivdep(simd) + "      for (int64_t j = 0; j < hw; ++j) o[j] = d[j] * a;\n    }\n";
    src += kernel("kc_cpu_bnb_input", q, (s.train ? "" : "  (void)w;\n") + loop + body);
    launches.push_back(launch("kc_cpu_bnb_input", grid, per, q.spec));
    return src;
  }

  bool handles(const OpCall& c, BnbShape& s) const {
    if (c.op != OpId::kBatchNormBackward || !dense_f32(c) || c.outputs.size() != 3 || !c.scalar("eps")) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || x->sizes.size() < 2 || x->numel() <= 0 || !same_sizes(x, defined_input(c, "grad_out"))) return false;
    s.n = x->sizes[0], s.c = x->sizes[1], s.hw = x->numel() / (s.n * s.c);
    s.train = c.int_arg("train", 1) != 0;
    s.has_w = defined_input(c, "weight") != nullptr;
    const char* const used[] = {"weight", s.train ? "save_mean" : "running_mean", s.train ? "save_invstd" : "running_var"};
    for (const char* p : used) {
      const TensorMeta* t = defined_input(c, p);
      if (t ? t->numel() != s.c : p != used[0]) return false;
    }
    s.gi = c.outputs[0].defined, s.gw = c.outputs[1].defined, s.gb = c.outputs[2].defined;
    if ((!s.gi && !s.gw && !s.gb) || ((s.gw || s.gb) && !s.has_w)) return false;
    if (s.gi && c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (c.outputs[i].defined && c.outputs[i].numel() != s.c) return false;
    return true;
  }
};

}  // namespace

const Template* cpu_batch_norm_backward_template() {
  static const BatchNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
