// CPU softmax / log_softmax templates and their backward: cpu.softmax, cpu.softmax_backward.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// _softmax/_log_softmax and their backward: dim must be the last one (may be negative).
bool last_dim(const OpCall& c, const TensorMeta& t) {
  const int64_t nd = static_cast<int64_t>(t.sizes.size());
  if (nd == 0) return false;
  int64_t d = c.int_arg("dim", -1);
  if (d < 0) d += nd;
  return d == nd - 1;
}

const char* kMaxFn = "static inline float kc_max(float m, float v) { return (v > m || v != v) ? v : m; }\n";

class SoftmaxTemplate : public Template {
 public:
  explicit SoftmaxTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cpu.softmax_backward" : "cpu.softmax"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    std::vector<KnobDim> s = {{"rows", rows_values(r.rows, r.n)}, {"unroll", kUnroll}, {"acc", kOnOff}, {"simd", kOnOff}};
    if (exp_op(c.op)) s.push_back({"vexp", {0, 1}});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    const bool is_log = c.op == OpId::kLogSoftmax || c.op == OpId::kLogSoftmaxBackward;
    const std::string opname = op_info(c.op).name;
    const std::string entry = "kc_cpu_" + opname;
    const std::string lead_name = backward_ ? "grad_output" : "self";
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("float*", "out", "out0");
    std::string body;
    if (!backward_) {
      a.ptr("const float*", "in", "self");
      a.i64("rows", "numel(self) / size(self,-1)");
      a.i64("n", "size(self,-1)");
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* KC_RS x = in + r * n;
      float* KC_RS y = out + r * n;
      float mx[KC_U];
      for (int u = 0; u < KC_U; ++u) mx[u] = -INFINITY;
      int64_t j = 0;
      for (; j + KC_U <= n; j += KC_U)
        for (int u = 0; u < KC_U; ++u) mx[u] = kc_max(mx[u], x[j + u]);
      for (; j < n; ++j) mx[0] = kc_max(mx[0], x[j]);
      float m = mx[0];
      for (int u = 1; u < KC_U; ++u) m = kc_max(m, mx[u]);
      kc_sum s[KC_U] = {};
@PASS2@    }
  }
)K";
      // exp(x - max) into y (a plain map, vectorizable), then its sum in KC_U lanes.
      body = replace_all(body, "@PASS2@", R"K(@IVDEP@      for (j = 0; j < n; ++j) y[j] = kc_exp(x[j] - m);
      j = 0;
      for (; j + KC_U <= n; j += KC_U)
        for (int u = 0; u < KC_U; ++u) s[u].add(y[j + u]);
      for (; j < n; ++j) s[0].add(y[j]);
@PASS3@)K");
      if (!is_log) {
        body = replace_all(body, "@PASS3@", R"K(      const float inv = (float)(1.0 / kc_total(s));
@IVDEP@      for (j = 0; j < n; ++j) y[j] *= inv;
)K");
      } else {
        body = replace_all(body, "@PASS3@", R"K(      const float ls = (float)log(kc_total(s));
@IVDEP@      for (j = 0; j < n; ++j) y[j] = (x[j] - m) - ls;
)K");
      }
    } else {
      a.ptr("const float*", "gin", "grad_output");
      a.ptr("const float*", "yin", "output");
      a.i64("rows", "numel(grad_output) / size(grad_output,-1)");
      a.i64("n", "size(grad_output,-1)");
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* KC_RS g = gin + r * n;
      const float* KC_RS y = yin + r * n;
      float* KC_RS o = out + r * n;
      kc_sum s[KC_U] = {};
      int64_t j = 0;
      for (; j + KC_U <= n; j += KC_U)
        for (int u = 0; u < KC_U; ++u) s[u].add(@TERM@);
      for (; j < n; ++j) {
        const int u = 0;
        s[u].add(@TERM@);
      }
      const float sf = (float)kc_total(s);
@IVDEP@      for (j = 0; j < n; ++j) o[j] = @OUT@;
    }
  }
)K";
      if (!is_log) {
        body = replace_all(body, "@TERM@", "(kc_acc_t)g[j + u] * (kc_acc_t)y[j + u]");
        body = replace_all(body, "@OUT@", "y[j] * (g[j] - sf)");
      } else {
        body = replace_all(body, "@TERM@", "g[j + u]");
        body = replace_all(body, "@OUT@", "g[j] - kc_exp(y[j]) * sf");
      }
    }
    body = replace_all(body, "@IVDEP@", ivdep(simd));
    std::string src = head(name(), opname, k.value()) + accumulators(k->at("acc") != 0) + kMaxFn +
                      (exp_op(c.op) ? exp_fn(k->count("vexp") && k->at("vexp")) : "") + kernel(entry, a, body);
    const int64_t per = k->at("rows");
    const std::string rows_expr = "numel(" + lead_name + ") / size(" + lead_name + ",-1)";
    json l = json::array({launch(entry, "ceil_div(" + rows_expr + ", " + str(per) + ")", per, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  bool backward_;

  bool handles(const OpCall& c, Rows& r) const {
    if (!dense_f32(c)) return false;
    const OpFamily fam = op_info(c.op).family;
    if (fam != (backward_ ? OpFamily::kSoftmaxBackward : OpFamily::kSoftmax)) return false;
    const TensorMeta* x = defined_input(c, backward_ ? "grad_output" : "self");
    if (!x || x->numel() <= 0 || !last_dim(c, *x)) return false;
    if (!c.outputs[0].defined || c.outputs[0].sizes != x->sizes) return false;
    if (backward_) {
      if (!same_sizes(x, defined_input(c, "output"))) return false;
      if (c.string_arg("input_dtype", "f32") != "f32") return false;
    } else {
      const ScalarArg* h = c.scalar("half_to_float");
      if (h) {
        const bool* hb = std::get_if<bool>(&h->value);
        const int64_t* hi = std::get_if<int64_t>(&h->value);
        if ((hb && *hb) || (hi && *hi) || (!hb && !hi)) return false;
      }
    }
    r.n = x->sizes.back();
    r.rows = x->numel() / r.n;
    return true;
  }
};


}  // namespace

const Template* cpu_softmax_template(bool backward) {
  static const SoftmaxTemplate fwd(false), bwd(true);
  return backward ? &bwd : &fwd;
}

}  // namespace kc::evolve
