// Max, average and adaptive average pooling, torch half: eager references and the error model.
// Max pooling selects an input element (exact; NaN wins, as in eager's `v > max || isnan(v)`), so
// its values and indices have no model; an average sums a window, so its error grows with the
// window's magnitude.
#include "evolve/ops/reference.h"

#include <cmath>

#include "evolve/ops/pool.h"

namespace kc::evolve {
namespace {

// Non-finite inputs have one answer in any order: max takes the NaN, a window sum holding +inf
// and -inf (or a NaN) is NaN whatever the order, one holding one sign of inf is that inf.
const std::vector<std::string> kPoolKinds = {"normal", "large", "offset", "extreme", "special"};

std::vector<at::Tensor> pool_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  if (c.op == OpId::kAdaptiveAvgPool2d) return {at::_adaptive_avg_pool2d(in[0], c.list_arg("output_size"))};
  if (c.op == OpId::kAdaptiveAvgPool3d) return {at::_adaptive_avg_pool3d(in[0], c.list_arg("output_size"))};
  const auto k = c.list_arg("kernel_size"), s = c.list_arg("stride"), p = c.list_arg("padding");
  const bool ceil = c.int_arg("ceil_mode", 0) != 0;
  // The values alone: aten::max_pool2d / max_pool3d, as the caught call runs them (CUDA computes
  // and drops the indices; CPU has a values-only kernel).
  if (c.op == OpId::kMaxPool2dValues || c.op == OpId::kMaxPool3dValues) {
    const auto d = c.list_arg("dilation");
    return {c.op == OpId::kMaxPool2dValues ? at::max_pool2d(in[0], k, s, p, d, ceil) : at::max_pool3d(in[0], k, s, p, d, ceil)};
  }
  if (c.op == OpId::kMaxPool2d || c.op == OpId::kMaxPool3d) {
    const auto d = c.list_arg("dilation");
    auto r = c.op == OpId::kMaxPool2d ? at::max_pool2d_with_indices(in[0], k, s, p, d, ceil)
                                      : at::max_pool3d_with_indices(in[0], k, s, p, d, ceil);
    return {std::get<0>(r), std::get<1>(r)};
  }
  const bool cip = c.int_arg("count_include_pad", 1) != 0;
  std::optional<int64_t> div;
  if (const ScalarArg* a = c.scalar("divisor_override"); a && std::holds_alternative<int64_t>(a->value))
    div = std::get<int64_t>(a->value);
  if (c.op == OpId::kAvgPool2d) return {at::avg_pool2d(in[0], k, s, p, ceil, cip, div)};
  return {at::avg_pool3d(in[0], k, s, p, ceil, cip, div)};
}

// Output j's condition magnitude, output-shaped, fp64. An average of n terms in fp32 errs by
// about sqrt(n) ulp of the mean magnitude in any order: (window mean of |x|) * sqrt(n) + |y|, n the
// largest window (adaptive: the longest adaptive window of each axis, pool.h).
// Max values and indices are exact: zero model leaves them the elementwise floor.
at::Tensor pool_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t j) {
  auto g = pool_geometry(c);
  if ((g.is_ok() && g->max) || j > 0) return at::zeros(c.outputs[j].sizes, in[0].options().dtype(at::kDouble));
  const double n = g.is_ok() ? static_cast<double>(g->k[0] * g->k[1] * g->k[2]) : 1.0;
  at::Tensor x = f64(in[0]);   // one fp64 copy of the input: |y| first, then |x| in place
  at::Tensor y = pool_eager(c, {x})[0].abs_();
  return pool_eager(c, {x.abs_()})[0].mul_(std::sqrt(n)).add_(y);
}

}  // namespace

extern const FamilyReference kPoolReference{&pool_eager, &kPoolKinds, 1e3, 3.0, nullptr, nullptr, nullptr,
                                            nullptr, false, &pool_whole};

}  // namespace kc::evolve
