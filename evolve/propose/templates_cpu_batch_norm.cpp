// CPU batch norm template: cpu.batch_norm (native_batch_norm forward, fp32).
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
//
// A channel c is N planes of HxW contiguous elements, C planes apart. Training without running
// statistics (with them the call writes its inputs, so it stays eager): launch 1 has a block per
// channel compute its moments two-pass in double over the N planes in order (deterministic),
// write save_mean / save_invstd and (mean, invstd * w, b) into scratch; launch 2 normalizes
// `planes` planes a block, y = (x - mean) * a + b. Eval: one launch over planes with (mean, a, b)
// from the running statistics; the CPU's eval statistics are empty ([0]), so nothing else is
// written. Knobs: planes (planes per block of the normalize launch), unroll (independent
// accumulator lanes), simd (restrict + ivdep on the inner loops).
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// Sum of x[0, n) and of (x - mu)^2 in KC_U double lanes (fixed order).
const char* kBnSums = R"K(static inline double kc_sum1(const float* KC_RS x, int64_t n) {
  double s[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) s[u] += x[j + u];
  for (; j < n; ++j) s[0] += x[j];
  double t = 0;
  for (int u = 0; u < KC_U; ++u) t += s[u];
  return t;
}
static inline double kc_sum2(const float* KC_RS x, int64_t n, double mu) {
  double q[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const double d = x[j + u] - mu;
      q[u] += d * d;
    }
  for (; j < n; ++j) q[0] += (x[j] - mu) * (x[j] - mu);
  double t = 0;
  for (int u = 0; u < KC_U; ++u) t += q[u];
  return t;
}
)K";

// One plane, y = (x - m) * a + b: the subtraction first, exact for x near m (a folded shift
// x * a + (b - m * a) would cancel on offset inputs).
const char* kBnPlane = R"K(static inline void kc_plane(const float* KC_RS x, float* KC_RS y, int64_t hw, float m, float a,
                            float b) {
)K";

struct BnShape {
  int64_t n = 0, c = 0, hw = 0;
  bool training = true;
};

class BatchNormTemplate : public Template {
 public:
  const char* name() const override { return "cpu.batch_norm"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    BnShape s;
    if (!handles(c, s)) return {};
    return {{"planes", rows_values(s.n * s.c, s.hw)}, {"unroll", kUnroll}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    BnShape s;
    if (!handles(c, s)) return unsupported("cpu.batch_norm does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool has_w = defined_input(c, "weight") != nullptr, has_b = defined_input(c, "bias") != nullptr;
    const bool simd = k->at("simd") != 0;
    std::string src = head(name(), std::string("native_batch_norm ") + (s.training ? "training" : "eval") +
                                        " weight=" + (has_w ? "yes" : "no") + " bias=" + (has_b ? "yes" : "no"), k.value());
    src += std::string("#define KC_W(c) ") + (has_w ? "(double)w[c]" : "1.0") + "\n";
    src += std::string("#define KC_B(c) ") + (has_b ? "(double)bb[c]" : "0.0") + "\n";
    src += kBnSums;
    src += std::string(kBnPlane) + ivdep(simd) + "  for (int64_t j = 0; j < hw; ++j) y[j] = (x[j] - m) * a + b;\n}\n";
    json launches = json::array(), scratch;
    src += kernels(s.training, has_w, has_b, simd, k->at("planes"), launches, scratch);
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  // The entries' text, and the launches of this setting.
  static std::string kernels(bool training, bool has_w, bool has_b, bool simd, int64_t per, json& launches,
                             json& scratch) {
    const std::string C = "size(input,1)", HW = "numel(input) / (size(input,0) * size(input,1))";
    const std::string planes = "size(input,0) * size(input,1)", grid = "ceil_div(" + planes + ", " + str(per) + ")";
    auto params = [&](Args& x) {
      if (has_w) x.ptr("const float*", "w", "weight");
      else x.nullptr_decl("const float*", "w");
      if (has_b) x.ptr("const float*", "bb", "bias");
      else x.nullptr_decl("const float*", "bb");
    };
    Args q;
    q.restrict_ptrs = simd;
    q.ptr("float*", "out", "out0");
    q.ptr("const float*", "in", "input");
    q.i64("n", "size(input,0)");
    q.i64("C", C);
    q.i64("hw", HW);
    // A block is `per` consecutive planes.
    const char* loop = R"K(  const int64_t per = ctx->block[0], np = n * C;
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t p = b * per; p < (b + 1) * per && p < np; ++p) {
      const int64_t c = p % C;
)K";
    if (!training) {   // (mean, a, b) from the running statistics
      params(q);
      q.ptr("const float*", "rm", "running_mean");
      q.ptr("const float*", "rv", "running_var");
      q.f64("eps", "eps");
      std::string src = kernel("kc_cpu_batch_norm_eval", q, std::string("  (void)w;\n  (void)bb;\n") + loop + R"K(      const double is = 1.0 / sqrt((double)rv[c] + eps);
      kc_plane(in + p * hw, out + p * hw, hw, rm[c], (float)(is * KC_W(c)), (float)KC_B(c));
    }
)K");
      launches.push_back(launch("kc_cpu_batch_norm_eval", grid, per, q.spec));
      return src;
    }
    Args st;
    st.restrict_ptrs = simd;
    st.ptr("float*", "mean_out", "out1");
    st.ptr("float*", "invstd_out", "out2");
    st.ptr("double*", "ss", "kc_ss");
    st.ptr("const float*", "in", "input");
    params(st);
    st.i64("n", "size(input,0)");
    st.i64("C", C);
    st.i64("hw", HW);
    st.f64("eps", "eps");
    std::string src = kernel("kc_cpu_batch_norm_stats", st, R"K(  (void)w;
  (void)bb;
  for (int64_t c = ctx->begin; c < ctx->end; ++c) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += kc_sum1(in + (i * C + c) * hw, hw);
    const double cnt = (double)n * (double)hw, mean = s / cnt;
    double q = 0;
    for (int64_t i = 0; i < n; ++i) q += kc_sum2(in + (i * C + c) * hw, hw, mean);
    const double is = 1.0 / sqrt(q / cnt + eps);
    mean_out[c] = (float)mean;
    invstd_out[c] = (float)is;
    ss[3 * c] = mean;
    ss[3 * c + 1] = is * KC_W(c);
    ss[3 * c + 2] = KC_B(c);
  }
)K");
    q.ptr("const double*", "ss", "kc_ss");
    src += kernel("kc_cpu_batch_norm_apply", q, std::string(loop) + R"K(      kc_plane(in + p * hw, out + p * hw, hw, (float)ss[3 * c], (float)ss[3 * c + 1], (float)ss[3 * c + 2]);
    }
)K");
    launches.push_back(launch("kc_cpu_batch_norm_stats", C, 1, st.spec));
    launches.push_back(launch("kc_cpu_batch_norm_apply", grid, per, q.spec));
    scratch = json::array({{{"name", "kc_ss"}, {"bytes", C + " * 24"}}});
    return src;
  }

  bool handles(const OpCall& c, BnShape& s) const {
    if (c.op != OpId::kBatchNorm || !dense_f32(c) || c.outputs.size() != 3 || !c.scalar("eps")) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || x->sizes.size() < 2 || x->numel() <= 0) return false;
    s.n = x->sizes[0], s.c = x->sizes[1], s.hw = x->numel() / (s.n * s.c);
    s.training = c.int_arg("training", 1) != 0;
    const bool running = defined_input(c, "running_mean") != nullptr;
    if (running != (defined_input(c, "running_var") != nullptr) || running == s.training) return false;
    for (const char* p : {"weight", "bias", "running_mean", "running_var"})
      if (const TensorMeta* t = defined_input(c, p); t && t->numel() != s.c) return false;
    if (!c.outputs[0].defined || c.outputs[0].sizes != x->sizes) return false;
    const int64_t stat = s.training ? s.c : 0;   // the CPU's eval statistics are empty
    return c.outputs[1].numel() == stat && c.outputs[2].numel() == stat;
  }
};

}  // namespace

const Template* cpu_batch_norm_template() {
  static const BatchNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
