// The CPU template tests' batch norm backward: the saved statistics a training forward writes,
// and fp64 references of grad_input, grad_weight and grad_bias with layer norm backward's bounds
// per channel (sums over the channel's M = N x HxW values).
#include <cmath>

#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve::cpu_ref {
namespace {

bool train(const OpCall& c) { return c.int_arg("train", 1) != 0; }

}  // namespace

void batch_norm_backward_inputs(const OpCall& c, Buffers& b) {
  if (!train(c)) return;
  const auto& sz = c.input("input")->sizes;
  const std::vector<float>& x = b["input"];
  const int64_t N = sz[0], C = sz[1], hw = static_cast<int64_t>(x.size()) / (N * C);
  for (int64_t ch = 0; ch < C; ++ch) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) s += x[(n * C + ch) * hw + j];
    const double mu = s / static_cast<double>(N * hw);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) q += (x[(n * C + ch) * hw + j] - mu) * (x[(n * C + ch) * hw + j] - mu);
    b["save_mean"][ch] = static_cast<float>(mu);
    b["save_invstd"][ch] = static_cast<float>(1.0 / std::sqrt(q / static_cast<double>(N * hw) + c.double_arg("eps", 1e-5)));
  }
}

void batch_norm_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  for (auto& e : out) e.k = 16;
  const auto& sz = c.input("input")->sizes;
  const std::vector<float>& x = b["input"];
  const std::vector<float>& dy = b["grad_out"];
  const int64_t N = sz[0], C = sz[1], hw = static_cast<int64_t>(x.size()) / (N * C);
  const double M = static_cast<double>(N * hw), g = std::sqrt(M);
  const bool tr = train(c), has_w = c.input("weight")->defined;
  for (int64_t ch = 0; ch < C; ++ch) {
    const double mu = tr ? b["save_mean"][ch] : b["running_mean"][ch];
    const double is = tr ? b["save_invstd"][ch] : 1.0 / std::sqrt(static_cast<double>(b["running_var"][ch]) + c.double_arg("eps", 1e-5));
    const double a = is * (has_w ? b["weight"][ch] : 1.0);
    double sd = 0, sda = 0, sx = 0, sxa = 0;
    auto at = [&](int64_t n, int64_t j) { return static_cast<size_t>((n * C + ch) * hw + j); };
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t i = at(n, j);
        const double xh = (x[i] - mu) * is;
        sd += dy[i], sda += std::fabs(dy[i]), sx += dy[i] * xh, sxa += std::fabs(dy[i] * xh);
      }
    if (c.outputs[1].defined) out[1].ref[ch] = sx, out[1].scale[ch] = (g + 3) * sxa + std::fabs(sx);
    if (c.outputs[2].defined) out[2].ref[ch] = sd, out[2].scale[ch] = (g + 1) * sda + std::fabs(sd);
    if (!c.outputs[0].defined) continue;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t i = at(n, j);
        const double xh = (x[i] - mu) * is;
        const double v = tr ? a * (dy[i] - sd / M - xh * sx / M) : a * dy[i];
        out[0].ref[i] = v;
        out[0].scale[i] = tr ? std::fabs(a) * (std::fabs(dy[i]) + g * sda / M + (1 + g) * std::fabs(xh) * sxa / M) + std::fabs(v)
                             : 4 * std::fabs(v);
      }
  }
}

}  // namespace kc::evolve::cpu_ref
