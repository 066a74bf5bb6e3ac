// Double-precision references for the CPU template tests; see template_cpu_reference.h.
#include "tests/unit/template_cpu_reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <sstream>

#include "runtime/ops.h"

// For each output, the exact value (from the float inputs, in double) and a scale: the bound
// follows the conditioning of the formula (1 + erf(x) loses digits for negative x in PyTorch's
// formula as in ours; layer norm's x - mean cancels).
namespace kc::evolve::cpu_ref {
namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kBeta = 0.79788456080286535588;   // sqrt(2/pi)
constexpr double kKappa = 0.044715;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

std::vector<Expect> reference(const OpCall& c, Buffers& b) {
  std::vector<Expect> out(c.outputs.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (c.outputs[i].defined) {
      out[i].ref.assign(c.outputs[i].numel(), 0);
      out[i].scale.assign(c.outputs[i].numel(), 0);
    }
  Expect& e = out[0];
  const std::string approx = c.string_arg("approximate", "none");
  switch (op_info(c.op).family) {
    case OpFamily::kUnary: {
      const auto& x = b["self"];
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i];
        double r = 0, s = 0;
        switch (c.op) {
          case OpId::kRelu: r = std::isnan(v) ? v : std::max(v, 0.0); break;
          case OpId::kGelu:
            if (approx == "tanh") r = 0.5 * v * (1 + std::tanh(kBeta * (v + kKappa * v * v * v)));
            else r = 0.5 * v * (1 + std::erf(v * kSqrt1_2));
            s = std::fabs(v);
            break;
          case OpId::kSilu: r = v * sigm(v); break;
          case OpId::kSigmoid: r = sigm(v); break;
          case OpId::kTanh: r = std::tanh(v); break;
          default: break;
        }
        e.ref[i] = r;
        e.scale[i] = s + std::fabs(r);
      }
      break;
    }
    case OpFamily::kUnaryBackward: {
      const auto& g = b["grad_output"];
      const auto& x = b[c.op == OpId::kSigmoidBackward || c.op == OpId::kTanhBackward ? "output" : "self"];
      const double th = c.double_arg("threshold", 0);
      for (size_t i = 0; i < g.size(); ++i) {
        const double gv = g[i], v = x[i], ag = std::fabs(gv);
        double r = 0, s = 0;
        switch (c.op) {
          case OpId::kReluBackward: r = v <= static_cast<double>(static_cast<float>(th)) ? 0 : gv; break;
          case OpId::kGeluBackward:
            if (approx == "tanh") {
              const double t = std::tanh(kBeta * (v + kKappa * v * v * v));
              const double id = kBeta * (1 + 3 * kKappa * v * v);
              r = gv * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * id);
              s = ag * (1 + 0.5 * std::fabs(v) * id);
            } else {
              const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
              r = gv * (0.5 * (1 + std::erf(v * kSqrt1_2)) + v * pdf);
              s = ag * (1 + std::fabs(v) * pdf * (1 + v * v));
            }
            break;
          case OpId::kSiluBackward: {
            const double sg = sigm(v);
            r = gv * sg * (1 + v * (1 - sg));
            s = ag * sg * (1 + std::fabs(v));
            break;
          }
          case OpId::kSigmoidBackward: r = gv * (1 - v) * v; break;
          case OpId::kTanhBackward:
            r = gv * (1 - v * v);
            s = ag * (1 + v * v);
            break;
          default: break;
        }
        e.ref[i] = r;
        e.scale[i] = s + std::fabs(r);
      }
      break;
    }
    case OpFamily::kSoftmax: {
      e.k = 16;
      const auto& x = b["self"];
      const int64_t n = c.input("self")->sizes.back(), rows = static_cast<int64_t>(x.size()) / n;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = &x[r * n];
        bool nan = false;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < n; ++j) nan |= std::isnan(xr[j]), m = std::max(m, static_cast<double>(xr[j]));
        for (int64_t j = 0; j < n; ++j) s += std::exp(xr[j] - m);
        for (int64_t j = 0; j < n; ++j) {
          double v = c.op == OpId::kSoftmax ? std::exp(xr[j] - m) / s : (xr[j] - m) - std::log(s);
          if (nan) v = NAN;
          e.ref[r * n + j] = v;
          e.scale[r * n + j] = c.op == OpId::kSoftmax ? std::fabs(v) : std::fabs(xr[j] - m) + std::log(s) + std::fabs(v);
        }
      }
      break;
    }
    case OpFamily::kSoftmaxBackward: {
      e.k = 16;
      const auto& g = b["grad_output"];
      const auto& y = b["output"];
      const int64_t n = c.input("output")->sizes.back(), rows = static_cast<int64_t>(g.size()) / n;
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0, sa = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double t = c.op == OpId::kSoftmaxBackward ? static_cast<double>(g[r * n + j]) * y[r * n + j] : g[r * n + j];
          s += t;
          sa += std::fabs(t);
        }
        for (int64_t j = 0; j < n; ++j) {
          const double gv = g[r * n + j], yv = y[r * n + j];
          if (c.op == OpId::kSoftmaxBackward) {
            e.ref[r * n + j] = yv * (gv - s);
            e.scale[r * n + j] = std::fabs(yv) * (std::fabs(gv) + sa);
          } else {
            e.ref[r * n + j] = gv - std::exp(yv) * s;
            e.scale[r * n + j] = std::fabs(gv) + std::exp(yv) * sa;
          }
        }
      }
      break;
    }
    case OpFamily::kLayerNorm: {
      for (auto& x : out) x.k = 16;
      const auto& x = b["input"];
      const int64_t rows = c.outputs[1].numel(), n = static_cast<int64_t>(x.size()) / rows;
      const bool hw = c.input("weight")->defined, hb = c.input("bias")->defined;
      const double eps = c.double_arg("eps", 1e-5);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = &x[r * n];
        double s = 0, sa = 0, q = 0;
        for (int64_t j = 0; j < n; ++j) s += xr[j], sa += std::fabs(xr[j]);
        const double mu = s / n;
        for (int64_t j = 0; j < n; ++j) q += (xr[j] - mu) * (xr[j] - mu);
        const double rstd = 1.0 / std::sqrt(q / n + eps);
        out[1].ref[r] = mu;
        out[1].scale[r] = sa / n;
        out[2].ref[r] = rstd;
        out[2].scale[r] = rstd;
        for (int64_t j = 0; j < n; ++j) {
          const double w = hw ? b["weight"][j] : 1.0, bb = hb ? b["bias"][j] : 0.0;
          const double v = (xr[j] - mu) * rstd * w + bb;
          e.ref[r * n + j] = v;
          e.scale[r * n + j] = (std::fabs(xr[j]) + std::fabs(mu)) * rstd * std::fabs(w) + std::fabs(bb) + std::fabs(v);
        }
      }
      break;
    }
    case OpFamily::kLayerNormBackward: {
      for (auto& x : out) x.k = 16;
      const auto& g = b["grad_out"];
      const auto& x = b["input"];
      const int64_t rows = c.input("mean")->numel(), n = static_cast<int64_t>(x.size()) / rows;
      const bool hw = c.input("weight")->defined;
      for (int64_t r = 0; r < rows; ++r) {
        const double mu = b["mean"][r], rs = b["rstd"][r];
        double a = 0, bsum = 0, aa = 0, ba = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double wg = g[r * n + j] * (hw ? b["weight"][j] : 1.0), xh = (x[r * n + j] - mu) * rs;
          a += wg, bsum += wg * xh, aa += std::fabs(wg), ba += std::fabs(wg * xh);
        }
        for (int64_t j = 0; j < n; ++j) {
          const size_t i = r * n + j;
          const double wg = g[i] * (hw ? b["weight"][j] : 1.0), xh = (x[i] - mu) * rs;
          const double xs = (std::fabs(x[i]) + std::fabs(mu)) * rs;
          if (c.outputs[0].defined) {
            out[0].ref[i] = rs * (wg - a / n - xh * bsum / n);
            out[0].scale[i] = rs * (std::fabs(wg) + aa / n + xs * ba / n) + std::fabs(out[0].ref[i]);
          }
          if (c.outputs[1].defined) out[1].ref[j] += g[i] * xh, out[1].scale[j] += std::fabs(g[i]) * xs;
          if (c.outputs[2].defined) out[2].ref[j] += g[i], out[2].scale[j] += std::fabs(g[i]);
        }
      }
      break;
    }
  }
  return out;
}

// Checks `got` against `e`; returns "" or a description of the first few mismatches.
std::string compare(const std::vector<float>& got, const Expect& e) {
  std::ostringstream msg;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = e.ref[i], g = got[i];
    bool ok;
    if (std::isnan(r)) ok = std::isnan(g);
    else if (std::isinf(r)) ok = g == r;
    else ok = std::isfinite(g) && std::fabs(g - r) <= e.k * FLT_EPSILON * e.scale[i] + 1e-37;
    if (!ok && bad++ < 4)
      msg << " [" << i << "] got " << g << " want " << r << " (tol " << e.k * FLT_EPSILON * e.scale[i] << ")";
  }
  if (bad) msg << " (" << bad << " of " << got.size() << " wrong)";
  return msg.str();
}

}  // namespace kc::evolve::cpu_ref
