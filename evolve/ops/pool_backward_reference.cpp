// Pooling backward, torch half: eager references, inputs (max pooling's indices are the argmax of
// the drawn `self`, as the forward saved them in training) and the error model. Every grad_input
// element is a sum of terms, one per window that holds it: dy (max pooling, only the windows whose
// argmax it is) or dy / divisor (average, adaptive). The terms' order differs between a gather and
// eager's scatter, so the model is that of a sum of m terms.
#include "evolve/ops/reference.h"

#include <cmath>

#include "evolve/ops/pool.h"

namespace kc::evolve {
namespace {

// Non-finite grad_output values have one answer in any order (a sum holding +inf and -inf, or a
// NaN, is NaN; one sign of inf is that inf), and a NaN in self is its window's argmax.
const std::vector<std::string> kPoolBackwardKinds = {"normal", "large", "offset", "extreme", "special"};

std::optional<int64_t> divisor_of(const OpCall& c) {
  if (const ScalarArg* a = c.scalar("divisor_override"); a && std::holds_alternative<int64_t>(a->value))
    return std::get<int64_t>(a->value);
  return std::nullopt;
}

std::vector<at::Tensor> pool_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  if (c.op == OpId::kAdaptiveAvgPool2dBackward) return {at::_adaptive_avg_pool2d_backward(in[0], in[1])};
  if (c.op == OpId::kAdaptiveAvgPool3dBackward) return {at::_adaptive_avg_pool3d_backward(in[0], in[1])};
  const auto k = c.list_arg("kernel_size"), s = c.list_arg("stride"), p = c.list_arg("padding");
  const bool ceil = c.int_arg("ceil_mode", 0) != 0;
  if (c.op == OpId::kMaxPool2dBackward || c.op == OpId::kMaxPool3dBackward) {
    const auto d = c.list_arg("dilation");
    if (c.op == OpId::kMaxPool2dBackward) return {at::max_pool2d_with_indices_backward(in[0], in[1], k, s, p, d, ceil, in[2])};
    return {at::max_pool3d_with_indices_backward(in[0], in[1], k, s, p, d, ceil, in[2])};
  }
  const bool cip = c.int_arg("count_include_pad", 1) != 0;
  if (c.op == OpId::kAvgPool2dBackward) return {at::avg_pool2d_backward(in[0], in[1], k, s, p, ceil, cip, divisor_of(c))};
  return {at::avg_pool3d_backward(in[0], in[1], k, s, p, ceil, cip, divisor_of(c))};
}

// Max pooling's indices: the forward's argmax of the drawn self (first index on ties, NaN wins).
void pool_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  if (c.op != OpId::kMaxPool2dBackward && c.op != OpId::kMaxPool3dBackward) return;
  const auto k = c.list_arg("kernel_size"), s = c.list_arg("stride"), p = c.list_arg("padding");
  const auto d = c.list_arg("dilation");
  const bool ceil = c.int_arg("ceil_mode", 0) != 0;
  auto r = c.op == OpId::kMaxPool2dBackward ? at::max_pool2d_with_indices(in[1], k, s, p, d, ceil)
                                            : at::max_pool3d_with_indices(in[1], k, s, p, d, ceil);
  in[2].copy_(std::get<1>(r));
}

// The number of windows that hold each input element, self-shaped, fp64: a product over the axes
// (windows are boxes), from the geometry (pool.h pool_windows_of).
at::Tensor windows_holding(const PoolGeom& g, const at::Tensor& x) {
  at::Tensor n = at::ones({1}, x.options());
  for (int a = 0; a < 3; ++a) {
    std::vector<double> v(g.in[a]);
    for (int64_t i = 0; i < g.in[a]; ++i) {
      int64_t lo, hi;
      pool_windows_of(g, a, i, lo, hi);
      v[i] = static_cast<double>(std::max<int64_t>(hi - lo, 0));
    }
    std::vector<int64_t> shape(3, 1);
    shape[a] = g.in[a];
    n = n * at::tensor(v, x.options().device(at::kCPU)).to(x.device()).view(shape);
  }
  std::vector<int64_t> lead(x.dim() - g.nd, 1);
  for (int a = 3 - g.nd; a < 3; ++a) lead.push_back(g.in[a]);
  return n.reshape(lead).expand(x.sizes());
}

// grad_input's condition magnitude, self-shaped, fp64: m terms summed in fp32 err by about
// sqrt(m) ulp of their magnitude in any order, sqrt(m) * (sum of |terms|) + |grad_input|, with m
// the terms that element receives: for max pooling the outputs whose argmax it is (the backward of
// a ones grad_output counts them exactly), else the windows that hold it. A term dy / divisor
// rounds once more (half an ulp of itself), inside that sum.
at::Tensor pool_backward_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t) {
  std::vector<at::Tensor> a = in;
  a[0] = f64(in[0]);
  a[1] = f64(in[1]);
  at::Tensor gi = pool_backward_eager(c, a)[0].abs_();
  at::Tensor dy = a[0];
  a[0] = dy.abs();
  at::Tensor mag = pool_backward_eager(c, a)[0];
  at::Tensor m;
  if (c.op == OpId::kMaxPool2dBackward || c.op == OpId::kMaxPool3dBackward) {
    a[0] = at::ones_like(dy);
    m = pool_backward_eager(c, a)[0];
  } else {
    auto g = pool_geometry(c);
    m = g.is_ok() ? windows_holding(g.value(), a[1]) : at::ones_like(mag);
  }
  return mag.mul_(m.sqrt()).add_(gi);
}

}  // namespace

extern const FamilyReference kPoolBackwardReference{&pool_backward_eager, &kPoolBackwardKinds, 1e3, 3.0,
                                                    &pool_backward_derive, nullptr, nullptr, nullptr, false,
                                                    &pool_backward_whole};

}  // namespace kc::evolve
