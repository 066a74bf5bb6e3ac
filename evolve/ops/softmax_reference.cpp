// Softmax and log_softmax, forward and backward, torch half: eager references, inputs (the
// backward's `output` from the forward) and the error model of a reduction over `dim`.
#include "evolve/ops/reference.h"

#include <algorithm>
#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme"};

std::vector<at::Tensor> softmax_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const int64_t dim = c.int_arg("dim", -1);
  const bool half_to_float = c.int_arg("half_to_float", 0);
  if (c.op == OpId::kLogSoftmax) return {at::_log_softmax(in[0], dim, half_to_float)};
  return {at::_softmax(in[0], dim, half_to_float)};
}

// The backward's input_dtype is the dtype of `output` as given (float64 under run_fp64).
std::vector<at::Tensor> softmax_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const int64_t dim = c.int_arg("dim", -1);
  if (c.op == OpId::kLogSoftmaxBackward) return {at::_log_softmax_backward_data(in[0], in[1], dim, in[1].scalar_type())};
  return {at::_softmax_backward_data(in[0], in[1], dim, in[1].scalar_type())};
}

void softmax_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device dev) {
  const int64_t dim = c.int_arg("dim", -1);
  at::Tensor y = c.op == OpId::kLogSoftmaxBackward ? at::_log_softmax(in[1], dim, false) : at::_softmax(in[1], dim, false);
  at::Tensor out = empty_like_meta(c.inputs[1], dev);
  out.copy_(y);
  in[1] = out;
}

RowView every_input_in_rows(size_t) { return RowView::kRows; }

// Rows [r, k], z = x - max(x): exp(z) rounds z (|z| ulp relative), the sum is of positive terms.
// softmax: y (1 + |z| + g (1 + sum y |z|)); log_softmax: |out| + |x| + |max| + |log sum| +
// g (1 + sum y |z|). Backward: softmax's dy' = y (dy - sum dy y): |dy'| + |y| (|dy| + |sum dy y| +
// g sum |dy y|); log_softmax's dy - exp(out) sum dy: |dy'| + |dy| + exp(out) (|sum dy| + g sum |dy|).
at::Tensor softmax_scale(const OpCall& call, const Chunk& c, size_t, const RowLayout& l) {
  const double g = std::sqrt(static_cast<double>(l.k));
  switch (call.op) {
    case OpId::kSoftmax:
    case OpId::kLogSoftmax: {
      at::Tensor x = f64(c.in[0]), m = x.amax(1, true);
      at::Tensor z = x - m, e = z.exp(), total = e.sum(1, true);
      at::Tensor spread = (e / total).mul_(z.abs()).sum(1, true).add_(1).mul_(g).add_(1);
      if (call.op == OpId::kSoftmax) return e.div_(total).mul_(z.abs_().add_(spread));
      return x.abs_().add_(m.abs()).add_(total.log().abs_()).add_(spread).add_(f64(c.r64).abs_());
    }
    case OpId::kSoftmaxBackward: {
      at::Tensor dy = f64(c.in[0]), y = f64(c.in[1]).abs_(), p = dy * y;
      at::Tensor h = p.sum(1, true).abs_();
      h.add_(p.abs_().sum(1, true).mul_(g));
      return dy.abs_().add_(h).mul_(y).add_(f64(c.r64).abs_());
    }
    default: {   // log_softmax backward
      at::Tensor dy = f64(c.in[0]), e = f64(c.in[1]).exp_();
      at::Tensor h = dy.sum(1, true).abs_();
      h.add_(dy.abs().sum(1, true).mul_(g));
      return e.mul_(h).add_(dy.abs_()).add_(f64(c.r64).abs_());
    }
  }
}

}  // namespace

// Softmax's large inputs are N(0,1) * 1e4: rows whose exponentials span far past fp32's range.
extern const FamilyReference kSoftmaxReference{&softmax_eager, &kReductionKinds, 1e4, 3.0, nullptr,
                                               &dim_layout, &every_input_in_rows, &softmax_scale, true, nullptr};
extern const FamilyReference kSoftmaxBackwardReference{&softmax_backward_eager, &kReductionKinds, 1e3, 3.0,
                                                       &softmax_backward_derive, &dim_layout,
                                                       &every_input_in_rows, &softmax_scale, true, nullptr};

}  // namespace kc::evolve
