// Double-precision references for the CPU template tests; see template_cpu_reference.h.
#include "tests/unit/template_cpu_reference.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <sstream>

#include "evolve/ops/pool.h"
#include "tests/unit/reduction_reference.h"
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

// Pooling, straight from the definition: each window's taps in (t, h, w) order; max values and
// indices exact (scale 0), an average (adaptive: over the adaptive window) within 16 ulp of its
// mean magnitude.
void pool(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  const PoolGeom g = pool_geometry(c).value();
  const auto& x = b["self"];
  const int64_t plane = g.in[0] * g.in[1] * g.in[2];
  size_t o = 0;
  for (int64_t pl = 0; pl < g.planes; ++pl)
    for (int64_t ot = 0; ot < g.out[0]; ++ot)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          const int64_t at[3] = {ot, oh, ow};
          int64_t lo[3], hi[3], n = 1;
          for (int a = 0; a < 3; ++a) {
            if (g.adaptive) {   // [floor(o In / Out), ceil((o + 1) In / Out))
              lo[a] = at[a] * g.in[a] / g.out[a];
              hi[a] = ((at[a] + 1) * g.in[a] + g.out[a] - 1) / g.out[a];
              n *= hi[a] - lo[a];
              continue;
            }
            lo[a] = at[a] * g.s[a] - g.p[a];
            hi[a] = g.max ? std::min(lo[a] + (g.k[a] - 1) * g.d[a] + 1, g.in[a]) : std::min(lo[a] + g.k[a], g.in[a] + g.p[a]);
            n *= hi[a] - lo[a];
            while (lo[a] < 0) lo[a] += g.max ? g.d[a] : 1;
            hi[a] = std::min(hi[a], g.in[a]);
          }
          double m = -INFINITY, s = 0, sa = 0;
          int64_t best = (lo[0] * g.in[1] + lo[1]) * g.in[2] + lo[2], cnt = 0;
          const int64_t st = g.max ? 1 : 0;   // dilation applies to max only
          for (int64_t t = lo[0]; t < hi[0]; t += st ? g.d[0] : 1)
            for (int64_t h = lo[1]; h < hi[1]; h += st ? g.d[1] : 1)
              for (int64_t w = lo[2]; w < hi[2]; w += st ? g.d[2] : 1) {
                const int64_t i = (t * g.in[1] + h) * g.in[2] + w;
                const double v = x[pl * plane + i];
                if (v > m || std::isnan(v)) m = v, best = i;
                s += v, sa += std::fabs(v), ++cnt;
              }
          if (g.max) {
            out[0].ref[o] = m;
            if (g.indices) out[1].ref[o] = static_cast<double>(best);
            continue;
          }
          const double div = g.divisor ? g.divisor : g.count_include_pad ? n : cnt;
          out[0].ref[o] = s / div;
          out[0].scale[o] = (sa + std::fabs(s)) / std::fabs(div);
        }
}

// Batch norm per channel over N planes of hw: training from the batch's moments (layer norm's
// bounds), eval elementwise from the running statistics; the CPU's eval statistics are empty.
void batch_norm(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  for (auto& x : out) x.k = 16;
  const auto& x = b["input"];
  const auto& sz = c.input("input")->sizes;
  const int64_t N = sz[0], C = sz[1], hw = static_cast<int64_t>(x.size()) / (N * C);
  const bool train = c.int_arg("training", 1) != 0, hw_ = c.input("weight")->defined, hb = c.input("bias")->defined;
  const double eps = c.double_arg("eps", 1e-5);
  for (int64_t ch = 0; ch < C; ++ch) {
    double mu = 0, rstd = 0;
    if (train) {
      double s = 0, sa = 0, q = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < hw; ++j) s += x[(n * C + ch) * hw + j], sa += std::fabs(x[(n * C + ch) * hw + j]);
      mu = s / (N * hw);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < hw; ++j) q += (x[(n * C + ch) * hw + j] - mu) * (x[(n * C + ch) * hw + j] - mu);
      rstd = 1.0 / std::sqrt(q / (N * hw) + eps);
      out[1].ref[ch] = mu, out[1].scale[ch] = sa / (N * hw);
      out[2].ref[ch] = rstd, out[2].scale[ch] = rstd;
    } else {
      mu = b["running_mean"][ch];
      rstd = 1.0 / std::sqrt(static_cast<double>(b["running_var"][ch]) + eps);
    }
    const double w = hw_ ? b["weight"][ch] : 1.0, bb = hb ? b["bias"][ch] : 0.0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t i = (n * C + ch) * hw + j;
        const double v = (x[i] - mu) * rstd * w + bb;
        out[0].ref[i] = v;
        out[0].scale[i] = (std::fabs(x[i]) + std::fabs(mu)) * rstd * std::fabs(w) + std::fabs(bb) + std::fabs(v);
      }
  }
}

void unary(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  Expect& e = out[0];
  const std::string approx = c.string_arg("approximate", "none");
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
      case OpId::kLeakyRelu: r = v > 0 ? v : v * static_cast<float>(c.double_arg("negative_slope", 0.01)); break;
      case OpId::kElu: {
        const double al = c.double_arg("alpha", 1), sc = c.double_arg("scale", 1), is = c.double_arg("input_scale", 1);
        r = v <= 0 ? std::expm1(v * is) * al * sc : v * sc;
        s = std::fabs(v * sc);
        break;
      }
      case OpId::kHardtanh:
        r = std::isnan(v) ? v : std::min(std::max(v, c.double_arg("min_val", -1)), c.double_arg("max_val", 1));
        break;
      case OpId::kHardsigmoid: r = std::isnan(v) ? v : std::min(std::max(v + 3, 0.0), 6.0) / 6; s = std::fabs(v); break;
      case OpId::kHardswish: r = v * (std::isnan(v) ? v : std::min(std::max(v + 3, 0.0), 6.0)) / 6; s = v * v; break;
      case OpId::kSoftplus: {
        const double be = c.double_arg("beta", 1), th = c.double_arg("threshold", 20);
        r = v * be > th ? v : std::log1p(std::exp(v * be)) / be;
        s = std::fabs(v);
        break;
      }
      case OpId::kMish: r = v * std::tanh(std::log1p(std::exp(v))); s = std::fabs(v); break;
      default: break;
    }
    e.ref[i] = r;
    e.scale[i] = s + std::fabs(r);
  }
}

void unary_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  Expect& e = out[0];
  const std::string approx = c.string_arg("approximate", "none");
  const auto& g = b["grad_output"];
  const auto& x = b[c.op == OpId::kSigmoidBackward || c.op == OpId::kTanhBackward ? "output"
                    : c.op == OpId::kEluBackward                                   ? "self_or_result"
                                                                                   : "self"];
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
      case OpId::kLeakyReluBackward: r = v > 0 ? gv : gv * static_cast<float>(c.double_arg("negative_slope", 0.01)); break;
      case OpId::kEluBackward: {
        const double al = c.double_arg("alpha", 1), sc = c.double_arg("scale", 1), is = c.double_arg("input_scale", 1);
        if (c.int_arg("is_result", 0)) r = v <= 0 ? gv * is * (v + al * sc) : gv * sc;
        else r = v <= 0 ? gv * is * al * sc * std::exp(v * is) : gv * sc;
        s = ag * (std::fabs(sc) + std::fabs(is * (std::fabs(v) + al * sc)));
        break;
      }
      case OpId::kHardtanhBackward:
        r = (v <= c.double_arg("min_val", -1) || v >= c.double_arg("max_val", 1)) ? 0 : gv;
        break;
      case OpId::kHardsigmoidBackward: r = (v > -3 && v < 3) ? gv / 6 : 0; break;
      case OpId::kHardswishBackward: r = v < -3 ? 0 : (v <= 3 ? gv * (v / 3 + 0.5) : gv); s = ag; break;
      case OpId::kSoftplusBackward: {
        const double be = c.double_arg("beta", 1), th = c.double_arg("threshold", 20);
        r = v * be > th ? gv : gv * sigm(v * be);
        s = ag;
        break;
      }
      case OpId::kMishBackward: {
        const double sg = sigm(v), t = std::tanh(std::log1p(std::exp(v)));
        r = gv * (t + v * sg * (1 - t * t));
        s = ag * (1 + std::fabs(v));
        break;
      }
      default: break;
    }
    e.ref[i] = r;
    e.scale[i] = s + std::fabs(r);
  }
}

void softmax(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  Expect& e = out[0];
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
}

void softmax_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  Expect& e = out[0];
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
}

// Rows of n normalized to mean 0, variance 1, then w[param(r, j)] x + b[param(r, j)]: layer norm
// (param j) and group norm over (n, g) rows (the element's channel).
void row_norm(const OpCall& c, Buffers& b, std::vector<Expect>& out, const std::function<int64_t(int64_t, int64_t)>& param) {
  Expect& e = out[0];
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
      const int64_t p = param(r, j);
      const double w = hw ? b["weight"][p] : 1.0, bb = hb ? b["bias"][p] : 0.0;
      const double v = (xr[j] - mu) * rstd * w + bb;
      e.ref[r * n + j] = v;
      e.scale[r * n + j] = (std::fabs(xr[j]) + std::fabs(mu)) * rstd * std::fabs(w) + std::fabs(bb) + std::fabs(v);
    }
  }
}

void layer_norm(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  row_norm(c, b, out, [](int64_t, int64_t j) { return j; });
}

void group_norm(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  const int64_t hw = c.int_arg("HxW", 1), groups = c.int_arg("group", 1);
  const int64_t cpg = c.int_arg("C", 1) / groups;
  row_norm(c, b, out, [=](int64_t r, int64_t j) { return (r % groups) * cpg + j / hw; });
}

void layer_norm_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
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
}

void scan(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  Expect& e = out[0];
  // Inclusive scans along dim, in order, in double. Scales follow the error of an fp32 fold of
  // j + 1 terms with g = sqrt(j + 1): cumsum g * sum |x|; cumprod (2g + 1) |y| (relative);
  // logcumsumexp |max| + g * (1 + |y|) (every log-domain step rounds |y|).
  e.k = 16;
  const auto& x = b["self"];
  const auto& sz = c.input("self")->sizes;
  const int64_t nd = static_cast<int64_t>(sz.size());
  int64_t dim = c.int_arg("dim", -1);
  if (dim < 0) dim += nd;
  int64_t inner = 1;
  for (int64_t i = dim + 1; i < nd; ++i) inner *= sz[i];
  const int64_t L = sz[dim], outer = static_cast<int64_t>(x.size()) / (L * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      double a = 0, sa = 0, m = -INFINITY;
      for (int64_t l = 0; l < L; ++l) {
        const size_t i = (o * L + l) * inner + j;
        const double v = x[i], g = std::sqrt(l + 1.0);
        if (c.op == OpId::kCumsum) a = l ? a + v : v;
        else if (c.op == OpId::kCumprod) a = l ? a * v : v;
        else a = l ? std::max(a, v) + std::log1p(std::exp(-std::fabs(a - v))) : v;
        sa += std::fabs(v);
        m = std::max(m, v);
        e.ref[i] = a;
        e.scale[i] = c.op == OpId::kCumsum ? g * sa + std::fabs(a)
                     : c.op == OpId::kCumprod ? (2 * g + 1) * std::fabs(a)
                                              : std::fabs(m) + g * (1 + std::fabs(a));
      }
    }
}

// Reductions (reduction_reference.h): sums within 16 ulp of their scale, picks exact.
void reduction(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  const ReduceGeom g = reduce_geometry(c).value();
  const auto& x = b["self"];
  for (auto& e : out) e.k = 16;
  for (int64_t o = 0; o < g.outer * g.inner; ++o) {
    const red_ref::Out r = red_ref::fold(g, x, o, FLT_EPSILON);
    out[0].ref[o] = r.ref, out[0].scale[o] = r.scale;
    if (out.size() > 1) out[1].ref[o] = r.out1, out[1].scale[o] = r.out1_scale;
  }
}

}  // namespace

std::vector<Expect> reference(const OpCall& c, Buffers& b) {
  std::vector<Expect> out(c.outputs.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (c.outputs[i].defined) {
      out[i].ref.assign(c.outputs[i].numel(), 0);
      out[i].scale.assign(c.outputs[i].numel(), 0);
    }
  switch (op_info(c.op).family) {
    case OpFamily::kUnary: unary(c, b, out); break;
    case OpFamily::kUnaryBackward: unary_backward(c, b, out); break;
    case OpFamily::kSoftmax: softmax(c, b, out); break;
    case OpFamily::kSoftmaxBackward: softmax_backward(c, b, out); break;
    case OpFamily::kLayerNorm: layer_norm(c, b, out); break;
    case OpFamily::kBatchNorm: batch_norm(c, b, out); break;
    case OpFamily::kGroupNorm: group_norm(c, b, out); break;
    case OpFamily::kLayerNormBackward: layer_norm_backward(c, b, out); break;
    case OpFamily::kScan: scan(c, b, out); break;
    case OpFamily::kReduction: reduction(c, b, out); break;
    case OpFamily::kPool:
      out[0].k = 16;
      pool(c, b, out);
      break;
    case OpFamily::kPoolBackward:
      out[0].k = 16;
      pool_backward(c, b, out);
      break;
    case OpFamily::kLoss: loss(c, b, out); break;
    case OpFamily::kLossBackward: loss_backward(c, b, out); break;
    case OpFamily::kBatchNormBackward: batch_norm_backward(c, b, out); break;
    case OpFamily::kGroupNormBackward: group_norm_backward(c, b, out); break;
    case OpFamily::kEmbeddingBackward: embedding_backward(c, b, out); break;
    default: break;
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
