// CPU elementwise templates: cpu.unary and cpu.unary_backward.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// cpu.unary and cpu.unary_backward: one element-wise loop over [0, numel) in blocks of `elems`.

constexpr const char* kGeluTanhConsts =
    "static const float kc_beta = 0.7978845608028654f;   /* sqrt(2/pi) */\n"
    "static const float kc_kappa = 0.044715f;\n";

// The scalar function kc_op(x, p, q, r) of an element-wise op (p, q, r: its scalars, see
// unary_params), or "" when the call's variant is not handled. NaN handling follows eager's CPU
// kernels, whose min/max propagate NaN.
std::string unary_fn(const OpCall& c) {
  const char* sig = "static inline float kc_op(float x, float p, float q, float r) {\n  (void)p; (void)q; (void)r;\n";
  auto fn = [&](const std::string& body) { return std::string(sig) + body + "}\n"; };
  switch (c.op) {
    case OpId::kRelu: return fn("  return (x > 0.0f || x != x) ? x : 0.0f;\n");
    case OpId::kGelu: {
      std::string a = c.string_arg("approximate", "none");
      if (a == "none") return fn("  return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));\n");
      if (a == "tanh")
        return std::string(kGeluTanhConsts) +
               fn("  const float inner = kc_beta * (x + kc_kappa * (x * x * x));\n"
                  "  return 0.5f * x * (1.0f + tanhf(inner));\n");
      return "";
    }
    case OpId::kSilu: return fn("  return x / (1.0f + kc_exp(-x));\n");
    case OpId::kSigmoid: return fn("  return 1.0f / (1.0f + kc_exp(-x));\n");
    case OpId::kTanh: return fn("  return tanhf(x);\n");
    case OpId::kLeakyRelu: return fn("  return x > 0.0f ? x : x * p;\n");
    case OpId::kElu: return fn("  return x <= 0.0f ? expm1f(x * r) * (p * q) : x * q;\n");
    case OpId::kHardtanh: return fn("  return x != x ? x : (x < p ? p : (x > q ? q : x));\n");
    case OpId::kHardsigmoid:
    case OpId::kHardswish: {
      std::string t = "  float t = x + 3.0f;\n  t = t < 0.0f ? 0.0f : t;\n  t = 6.0f < t ? 6.0f : t;\n";
      return fn(t + (c.op == OpId::kHardsigmoid ? "  return t / 6.0f;\n" : "  return x * t / 6.0f;\n"));
    }
    case OpId::kSoftplus: return fn("  return (x * p) > q ? x : log1pf(expf(x * p)) / p;\n");
    case OpId::kMish: return fn("  return x * tanhf(log1pf(expf(x)));\n");
    default: return "";
  }
}

// kc_op(g, x, p, q, r): g the incoming gradient, x the saved tensor, p, q, r its scalars.
std::string unary_backward_fn(const OpCall& c) {
  const char* sig = "static inline float kc_op(float g, float x, float p, float q, float r) {\n  (void)p; (void)q; (void)r;\n";
  auto fn = [&](const std::string& body) { return std::string(sig) + body + "}\n"; };
  switch (c.op) {
    case OpId::kReluBackward: return fn("  return x <= p ? 0.0f : g;\n");
    case OpId::kGeluBackward: {
      std::string a = c.string_arg("approximate", "none");
      if (a == "none")
        return fn("  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));\n"
                  "  const float pdf = 0.3989422804014327f * expf(x * x * -0.5f);   /* 1/sqrt(2 pi) */\n"
                  "  return g * (cdf + x * pdf);\n");
      if (a == "tanh")
        return std::string(kGeluTanhConsts) +
               fn("  const float x_sq = x * x;\n"
                  "  const float inner = kc_beta * (x + kc_kappa * (x_sq * x));\n"
                  "  const float t = tanhf(inner);\n"
                  "  const float left = 0.5f * x;\n"
                  "  const float right = 1.0f + t;\n"
                  "  const float left_derivative = 0.5f * right;\n"
                  "  const float right_derivative = 1.0f - t * t;\n"
                  "  const float inner_derivative = kc_beta * (1.0f + 3.0f * kc_kappa * x_sq);\n"
                  "  return g * (left_derivative + left * right_derivative * inner_derivative);\n");
      return "";
    }
    case OpId::kSiluBackward:
      return fn("  const float s = 1.0f / (1.0f + kc_exp(-x));\n  return g * s * (1.0f + x * (1.0f - s));\n");
    case OpId::kSigmoidBackward: return fn("  return g * (1.0f - x) * x;\n");
    case OpId::kTanhBackward: return fn("  return g * (1.0f - x * x);\n");
    case OpId::kLeakyReluBackward: return fn("  return x > 0.0f ? g : g * p;\n");
    case OpId::kEluBackward:
      if (c.int_arg("is_result", 0)) return fn("  return x <= 0.0f ? g * r * (x + p * q) : g * q;\n");
      return fn("  return x <= 0.0f ? g * r * (p * q) * expf(x * r) : g * q;\n");
    case OpId::kHardtanhBackward: return fn("  return (x <= p || x >= q) ? 0.0f : g;\n");
    case OpId::kHardsigmoidBackward: return fn("  return (x > -3.0f && x < 3.0f) ? g / 6.0f : 0.0f;\n");
    case OpId::kHardswishBackward:
      return fn("  return x < -3.0f ? 0.0f : (x <= 3.0f ? g * ((x / 3.0f) + 0.5f) : g);\n");
    case OpId::kSoftplusBackward:
      return fn("  const float z = expf(x * p);\n  return (x * p) > q ? g : g * z / (z + 1.0f);\n");
    case OpId::kMishBackward:
      return fn("  const float s = 1.0f / (1.0f + expf(-x));\n  const float t = tanhf(log1pf(expf(x)));\n"
                "  return g * (t + x * s * (1.0f - t * t));\n");
    default: return "";
  }
}

// The scalars an op's kc_op reads as p, q, r, in that order.
std::vector<const char*> unary_params(OpId op) {
  switch (op) {
    case OpId::kReluBackward: return {"threshold"};
    case OpId::kLeakyRelu:
    case OpId::kLeakyReluBackward: return {"negative_slope"};
    case OpId::kElu:
    case OpId::kEluBackward: return {"alpha", "scale", "input_scale"};
    case OpId::kHardtanh:
    case OpId::kHardtanhBackward: return {"min_val", "max_val"};
    case OpId::kSoftplus:
    case OpId::kSoftplusBackward: return {"beta", "threshold"};
    default: return {};
  }
}

// Declares p, q, r: the op's scalars (launch args), 0 for the rest.
void declare_params(Args& a, OpId op) {
  auto ps = unary_params(op);
  const char* vars[] = {"p", "q", "r"};
  for (size_t i = 0; i < 3; ++i) {
    if (i < ps.size()) a.f32(vars[i], ps[i]);
    else a.decl += std::string("  const float ") + vars[i] + " = 0.0f;\n";
  }
}

// True when every scalar the op reads is a number that converts to float.
bool params_ok(const OpCall& c) {
  for (const char* n : unary_params(c.op)) {
    const ScalarArg* t = c.scalar(n);
    if (!t) return false;
    if (const double* d = std::get_if<double>(&t->value)) {
      if (std::isfinite(*d) && std::fabs(*d) > 3.4028234663852886e38) return false;  // not a float
    } else if (!std::holds_alternative<int64_t>(t->value)) {
      return false;
    }
  }
  return true;
}

// The saved-tensor argument name of a backward op ("self" or "output").
const char* saved_name(OpId op) {
  if (op == OpId::kEluBackward) return "self_or_result";
  return (op == OpId::kSigmoidBackward || op == OpId::kTanhBackward) ? "output" : "self";
}

class UnaryTemplate : public Template {
 public:
  explicit UnaryTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cpu.unary_backward" : "cpu.unary"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    if (!handles(c)) return {};
    std::vector<KnobDim> s = {{"elems", elems_values(lead(c)->numel())}, {"unroll", kUnroll}, {"simd", kOnOff}};
    if (exp_op(c.op)) s.push_back({"vexp", {0, 1}});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const int64_t elems = k->at("elems");
    const bool simd = k->at("simd") != 0;
    const std::string fn = backward_ ? unary_backward_fn(c) : unary_fn(c);
    const std::string opname = op_info(c.op).name;
    const std::string entry = "kc_cpu_" + opname;
    const std::string lead_name = backward_ ? "grad_output" : "self";
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("float*", "out", "out0");
    std::string body;
    if (!backward_) {
      a.ptr("const float*", "x", "self");
      a.i64("n", "numel(self)");
      declare_params(a, c.op);
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    int64_t i = lo;
@IVDEP@    for (; i + KC_U <= hi; i += KC_U) {
      for (int u = 0; u < KC_U; ++u) out[i + u] = kc_op(x[i + u], p, q, r);
    }
    for (; i < hi; ++i) out[i] = kc_op(x[i], p, q, r);
  }
)K";
    } else {
      a.ptr("const float*", "g", "grad_output");
      a.ptr("const float*", "x", saved_name(c.op));
      a.i64("n", "numel(grad_output)");
      declare_params(a, c.op);
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    int64_t i = lo;
@IVDEP@    for (; i + KC_U <= hi; i += KC_U) {
      for (int u = 0; u < KC_U; ++u) out[i + u] = kc_op(g[i + u], x[i + u], p, q, r);
    }
    for (; i < hi; ++i) out[i] = kc_op(g[i], x[i], p, q, r);
  }
)K";
    }
    std::string what = opname;
    if (c.op == OpId::kGelu || c.op == OpId::kGeluBackward) what += " approximate=" + c.string_arg("approximate", "none");
    const bool vexp = k->count("vexp") && k->at("vexp");
    std::string src = head(name(), what, k.value()) + (exp_op(c.op) ? exp_fn(vexp) : "") + fn +
                      kernel(entry, a, replace_all(body, "@IVDEP@", ivdep(simd)));
    json l = json::array({launch(entry, "ceil_div(numel(" + lead_name + "), " + str(elems) + ")", elems, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  bool backward_;

  const TensorMeta* lead(const OpCall& c) const { return defined_input(c, backward_ ? "grad_output" : "self"); }

  bool handles(const OpCall& c) const {
    if (!dense_f32(c)) return false;
    const TensorMeta* x = lead(c);
    if (!x || x->numel() <= 0 || c.outputs[0].numel() != x->numel() || !c.outputs[0].defined) return false;
    if (!backward_) {
      if (op_info(c.op).family != OpFamily::kUnary) return false;
      return params_ok(c) && !unary_fn(c).empty();
    }
    if (op_info(c.op).family != OpFamily::kUnaryBackward) return false;
    if (!same_sizes(x, defined_input(c, saved_name(c.op)))) return false;
    return params_ok(c) && !unary_backward_fn(c).empty();
  }
};


}  // namespace

const Template* cpu_unary_template(bool backward) {
  static const UnaryTemplate fwd(false), bwd(true);
  return backward ? &bwd : &fwd;
}

}  // namespace kc::evolve
