// fp64 references of the elementwise families for the CUDA template tests
// (template_gpu_reference.h): the activations and their backward, each element's scale from its
// own magnitude (forward: 1 + |x|; backward: |g| (1 + |x|)).
#include <cmath>
#include <cstdlib>
#include <functional>

#include "runtime/ops.h"
#include "tests/gpu/template_gpu_reference.h"

namespace kc::evolve::gpu_ref {
namespace {

double gelu(double x, bool tanh_approx) {
  if (!tanh_approx) return 0.5 * x * (1 + std::erf(x * M_SQRT1_2));
  const double k = std::sqrt(2 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x, bool tanh_approx) {
  if (!tanh_approx) return 0.5 * (1 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
  const double k = std::sqrt(2 / M_PI), inner = k * (x + 0.044715 * x * x * x), t = std::tanh(inner);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double sigm(double x) { return 1 / (1 + std::exp(-x)); }

double mag(double x) { return 1 + (std::isfinite(x) ? std::fabs(x) : 0.0); }

std::vector<Expect> each(const Vec& a, const std::function<double(double)>& f) {
  Expect e;
  for (double x : a) {
    e.ref.push_back(f(x));
    e.scale.push_back(mag(x));
  }
  return {e};
}

std::vector<Expect> each2(const Vec& g, const Vec& b, const std::function<double(double, double)>& f) {
  Expect e;
  for (size_t i = 0; i < g.size(); ++i) {
    e.ref.push_back(f(g[i], b[i]));
    e.scale.push_back(std::fabs(g[i]) * mag(b[i]));
  }
  return {e};
}

}  // namespace

std::vector<Expect> unary(const OpCall& c, const std::map<std::string, Vec>& in) {
  const bool tanh_approx = c.string_arg("approximate", "none") == "tanh";
  switch (c.op) {
    case OpId::kRelu: return each(in.at("self"), [](double x) { return (x > 0 || std::isnan(x)) ? x : 0.0; });
    case OpId::kGelu: return each(in.at("self"), [&](double x) { return gelu(x, tanh_approx); });
    case OpId::kSilu: return each(in.at("self"), [](double x) { return x * sigm(x); });
    case OpId::kSigmoid: return each(in.at("self"), sigm);
    case OpId::kTanh: return each(in.at("self"), [](double x) { return std::tanh(x); });
    // The scalars as the kernels see them (float); fmin/fmax where eager's CUDA std::min/max are.
    case OpId::kLeakyRelu: {
      const double sl = static_cast<float>(c.double_arg("negative_slope", 0.01));
      return each(in.at("self"), [sl](double x) { return x > 0 ? x : x * sl; });
    }
    case OpId::kElu: {
      const double al = c.double_arg("alpha", 1), sc = c.double_arg("scale", 1), is = c.double_arg("input_scale", 1);
      return each(in.at("self"), [=](double x) { return x > 0 ? x * sc : std::expm1(x * is) * al * sc; });
    }
    case OpId::kHardtanh: {
      const double lo = c.double_arg("min_val", -1), hi = c.double_arg("max_val", 1);
      return each(in.at("self"), [=](double x) { return std::isnan(x) ? x : std::fmin(std::fmax(x, lo), hi); });
    }
    case OpId::kHardsigmoid:
      return each(in.at("self"), [](double x) { return std::fmin(std::fmax(x + 3, 0.0), 6.0) / 6; });
    case OpId::kHardswish:
      return each(in.at("self"), [](double x) { return x * std::fmin(std::fmax(x + 3, 0.0), 6.0) / 6; });
    case OpId::kSoftplus: {
      const double be = c.double_arg("beta", 1), th = c.double_arg("threshold", 20);
      return each(in.at("self"), [=](double x) { return x * be > th ? x : std::log1p(std::exp(x * be)) / be; });
    }
    case OpId::kMish: return each(in.at("self"), [](double x) { return x * std::tanh(std::log1p(std::exp(x))); });
    default: std::abort();   // an op of the family without a reference here
  }
}

std::vector<Expect> unary_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const bool tanh_approx = c.string_arg("approximate", "none") == "tanh";
  switch (c.op) {
    case OpId::kLeakyReluBackward: {
      const double sl = static_cast<float>(c.double_arg("negative_slope", 0.01));
      return each2(in.at("grad_output"), in.at("self"), [sl](double g, double x) { return x > 0 ? g : g * sl; });
    }
    case OpId::kEluBackward: {
      const double al = c.double_arg("alpha", 1), sc = c.double_arg("scale", 1), is = c.double_arg("input_scale", 1);
      const bool res = c.int_arg("is_result", 0) != 0;
      return each2(in.at("grad_output"), in.at("self_or_result"), [=](double g, double x) {
        if (!(x <= 0)) return g * sc;   // NaN takes the positive branch, as in eager
        return res ? g * is * (x + al * sc) : g * is * al * sc * std::exp(x * is);
      });
    }
    case OpId::kHardtanhBackward: {
      const double lo = c.double_arg("min_val", -1), hi = c.double_arg("max_val", 1);
      return each2(in.at("grad_output"), in.at("self"), [=](double g, double x) { return (x <= lo || x >= hi) ? 0.0 : g; });
    }
    case OpId::kHardsigmoidBackward:
      return each2(in.at("grad_output"), in.at("self"), [](double g, double x) { return (x > -3 && x < 3) ? g / 6 : 0.0; });
    case OpId::kHardswishBackward:
      return each2(in.at("grad_output"), in.at("self"),
                   [](double g, double x) { return x < -3 ? 0.0 : (x <= 3 ? g * (x / 3 + 0.5) : g); });
    case OpId::kSoftplusBackward: {
      const double be = c.double_arg("beta", 1), th = c.double_arg("threshold", 20);
      return each2(in.at("grad_output"), in.at("self"), [=](double g, double x) { return x * be > th ? g : g * sigm(x * be); });
    }
    case OpId::kMishBackward:
      return each2(in.at("grad_output"), in.at("self"), [](double g, double x) {
        const double t = std::tanh(std::log1p(std::exp(x)));
        return g * (t + x * sigm(x) * (1 - t * t));
      });
    case OpId::kReluBackward: {
      const float th = static_cast<float>(c.double_arg("threshold", 0));
      const double t = Host::round(c.inputs[0].dtype, th);
      return each2(in.at("grad_output"), in.at("self"), [t](double g, double x) { return x <= t ? 0.0 : g; });
    }
    case OpId::kGeluBackward:
      return each2(in.at("grad_output"), in.at("self"), [&](double g, double x) { return g * gelu_grad(x, tanh_approx); });
    case OpId::kSiluBackward:
      return each2(in.at("grad_output"), in.at("self"),
                   [](double g, double x) { return g * sigm(x) * (1 + x * (1 - sigm(x))); });
    case OpId::kSigmoidBackward:
      return each2(in.at("grad_output"), in.at("output"), [](double g, double y) { return g * (1 - y) * y; });
    case OpId::kTanhBackward:
      return each2(in.at("grad_output"), in.at("output"), [](double g, double y) { return g * (1 - y * y); });
    default: std::abort();   // an op of the family without a reference here
  }
}

}  // namespace kc::evolve::gpu_ref
