// The CPU template tests' group norm backward: mean and rstd as the forward saves them, and fp64
// references of grad_input (per (n, group) row of K = C / group x HxW values), grad_weight and
// grad_bias (per channel, over its M = N x HxW values) with layer norm backward's bounds.
#include <cmath>

#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve::cpu_ref {
namespace {

struct Geom {
  int64_t N, C, hw, G, D;
};

Geom geom(const OpCall& c) {
  Geom g{c.int_arg("N", 0), c.int_arg("C", 0), c.int_arg("HxW", 0), c.int_arg("group", 1), 0};
  g.D = g.C / g.G;
  return g;
}

}  // namespace

void group_norm_backward_inputs(const OpCall& c, Buffers& b) {
  const Geom g = geom(c);
  const std::vector<float>& x = b["input"];
  const int64_t K = g.D * g.hw;
  for (int64_t r = 0; r < g.N * g.G; ++r) {   // a row is contiguous: K elements from r K
    double s = 0, q = 0;
    for (int64_t j = 0; j < K; ++j) s += x[r * K + j];
    const double mu = s / static_cast<double>(K);
    for (int64_t j = 0; j < K; ++j) q += (x[r * K + j] - mu) * (x[r * K + j] - mu);
    b["mean"][r] = static_cast<float>(mu);
    b["rstd"][r] = static_cast<float>(1.0 / std::sqrt(q / static_cast<double>(K) + 1e-5));
  }
}

void group_norm_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  for (auto& e : out) e.k = 16;
  const Geom g = geom(c);
  const std::vector<float>& x = b["input"];
  const std::vector<float>& dy = b["grad_out"];
  const bool has_w = c.input("weight")->defined;
  const int64_t K = g.D * g.hw;
  const double h = std::sqrt(static_cast<double>(K)), gm = std::sqrt(static_cast<double>(g.N * g.hw));
  std::vector<double> sd(g.C, 0.0), sda(g.C, 0.0), sx(g.C, 0.0), sxa(g.C, 0.0);
  for (int64_t r = 0; r < g.N * g.G; ++r) {
    const double mu = b["mean"][r], rs = b["rstd"][r];
    double a = 0, aa = 0, p = 0, pa = 0;   // sums of w dy and w dy xhat over the row
    for (int64_t j = 0; j < K; ++j) {
      const int64_t ch = (r % g.G) * g.D + j / g.hw;
      const size_t i = static_cast<size_t>(r * K + j);
      const double w = has_w ? b["weight"][ch] : 1.0, xh = (x[i] - mu) * rs;
      a += w * dy[i], aa += std::fabs(w * dy[i]), p += w * dy[i] * xh, pa += std::fabs(w * dy[i] * xh);
      sd[ch] += dy[i], sda[ch] += std::fabs(dy[i]), sx[ch] += dy[i] * xh, sxa[ch] += std::fabs(dy[i] * xh);
    }
    if (!c.outputs[0].defined) continue;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t ch = (r % g.G) * g.D + j / g.hw;
      const size_t i = static_cast<size_t>(r * K + j);
      const double w = has_w ? b["weight"][ch] : 1.0, xh = (x[i] - mu) * rs;
      const double v = rs * (w * dy[i] - a / K - xh * p / K);
      out[0].ref[i] = v;
      out[0].scale[i] = std::fabs(rs) * (std::fabs(w * dy[i]) + h * aa / K + (1 + h) * std::fabs(xh) * pa / K) + std::fabs(v);
    }
  }
  for (int64_t ch = 0; ch < g.C; ++ch) {
    if (c.outputs[1].defined) out[1].ref[ch] = sx[ch], out[1].scale[ch] = (gm + 3) * sxa[ch] + std::fabs(sx[ch]);
    if (c.outputs[2].defined) out[2].ref[ch] = sd[ch], out[2].scale[ch] = (gm + 1) * sda[ch] + std::fabs(sd[ch]);
  }
}

}  // namespace kc::evolve::cpu_ref
