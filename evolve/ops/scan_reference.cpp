// Scans, torch half: eager references and the error model of an inclusive scan along `dim`.
#include "evolve/ops/reference.h"

#include <algorithm>
#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kScanKinds = {"normal", "large", "offset", "extreme"};

// The requested output dtype; none under run_fp64 (float64 inputs keep float64).
std::optional<at::ScalarType> dtype_arg(const OpCall& c, const at::Tensor& x) {
  const std::string want = c.string_arg("dtype", "none");
  auto d = dtype_from_name(want);
  if (want == "none" || !d || x.scalar_type() == at::kDouble) return std::nullopt;
  return to_scalar_type(*d);
}

std::vector<at::Tensor> scan_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const int64_t dim = c.int_arg("dim", -1);
  switch (c.op) {
    case OpId::kCumsum: return {at::cumsum(in[0], dim, dtype_arg(c, in[0]))};
    case OpId::kCumprod: return {at::cumprod(in[0], dim, dtype_arg(c, in[0]))};
    default: return {at::_logcumsumexp(in[0], dim)};
  }
}

RowView scan_view(size_t) { return RowView::kRows; }

// Rows [r, k]; element j of a row is a fold of its j + 1 leading inputs in any order, so with
// g_j = sqrt(j + 1): cumsum g_j sum_{i<=j} |x_i|; cumprod's error is relative, g_j |y_j| per
// multiply chain (twice, for a parallel scan's two passes); logcumsumexp log(sum exp) after the
// running max m_j: |m_j| + |y_j| + g_j (the sum's relative error is absolute after the log).
at::Tensor scan_scale(const OpCall& call, const Chunk& c, size_t, const RowLayout& l) {
  at::Tensor x = f64(c.in[0]), y = f64(c.r64).abs_();
  at::Tensor g = at::arange(1, l.k + 1, x.options()).sqrt_().reshape({1, l.k});
  switch (call.op) {
    case OpId::kCumsum: return x.abs_().cumsum(1).mul_(g).add_(y);
    case OpId::kCumprod: return y.mul(g).mul_(2).add_(y);
    default: return std::get<0>(x.cummax(1)).abs_().add_(y).add_(g);
  }
}

}  // namespace

extern const FamilyReference kScanReference{&scan_eager, &kScanKinds, 1e3, 3.0, nullptr, &dim_layout,
                                            &scan_view, &scan_scale, true, nullptr};

}  // namespace kc::evolve
