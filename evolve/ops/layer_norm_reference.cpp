// Layer norm forward and backward, torch half: eager references, inputs (the backward's mean and
// rstd from the forward; offset rows at N(100, 1)) and the error model of a reduction over the
// flattened normalized dims.
#include "evolve/ops/reference.h"

#include <array>
#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme"};

std::vector<at::Tensor> layer_norm_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto r = at::native_layer_norm(in[0], c.list_arg("normalized_shape"), opt(in[1]), opt(in[2]), c.double_arg("eps", 1e-5));
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

std::vector<at::Tensor> layer_norm_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto m = c.list_arg("output_mask");
  std::array<bool, 3> mask = {m.size() > 0 && m[0], m.size() > 1 && m[1], m.size() > 2 && m[2]};
  auto r = at::native_layer_norm_backward(in[0], in[1], c.list_arg("normalized_shape"), in[2], in[3], opt(in[4]),
                                          opt(in[5]), mask);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

void layer_norm_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  auto stats = at::native_layer_norm(in[1], c.list_arg("normalized_shape"), opt(in[4]), opt(in[5]), 1e-5);
  in[2].copy_(std::get<1>(stats).view(in[2].sizes()));
  in[3].copy_(std::get<2>(stats).view(in[3].sizes()));
}

RowLayout layer_norm_layout(const OpCall& c, const std::vector<at::Tensor>&, size_t j) {
  RowLayout l;
  l.model = true;
  for (int64_t v : c.list_arg("normalized_shape")) l.k *= std::max<int64_t>(1, v);
  l.dim = -1;
  l.stat = c.op == OpId::kLayerNorm && j > 0;
  l.col = c.op == OpId::kLayerNormBackward && j > 0;
  l.rounds_once = true;   // fp32 arithmetic (CUDA eager's accumulate type), each half output rounded once
  return l;
}

RowView layer_norm_view(size_t k) { return k == 0 ? RowView::kRows : RowView::kWhole; }
RowView layer_norm_backward_view(size_t k) { return k < 2 ? RowView::kRows : k < 4 ? RowView::kStat : RowView::kWhole; }

at::Tensor param_of(const at::Tensor& t, int64_t n, double fill, const at::Tensor& like) {
  return t.defined() ? f64(t).reshape({1, n}) : at::full({1, n}, fill, like.options().dtype(at::kDouble));
}

// Forward. The mean sums x: |mean| + g mean|x| (g = sqrt(n)). The variance sums (x - mean)^2,
// positive terms whose inputs are exact to first order (the mean's error enters squared):
// rstd (1 + g var / (var + eps)). The output rounds x - mean (or x rstd w - mean rstd w, eager's
// fused form) and carries the statistics' errors: |y| + (|x| + |mean|) rstd |w| + |b| +
// g rstd |w| (mean|x| + |x - mean|).
at::Tensor layer_norm_scale(const OpCall& call, const Chunk& c, size_t j, const RowLayout& l) {
  const int64_t n = l.k;
  const double eps = call.double_arg("eps", 1e-5);
  at::Tensor x = f64(c.in[0]);
  const double g = std::sqrt(static_cast<double>(n));
  at::Tensor mean = x.mean(1, true), mabs = x.abs().mean(1, true);
  if (j == 1) return mean.abs_() + g * mabs;
  at::Tensor d = x - mean;
  at::Tensor var = d.square().mean(1, true), rstd = (var + eps).rsqrt();
  if (j == 2) return rstd * (1 + g * var / (var + eps));
  at::Tensor aw = param_of(c.in[1], n, 1.0, x).abs_(), ab = param_of(c.in[2], n, 0.0, x).abs_();
  at::Tensor h = (x.abs_() + mean.abs()).mul_(rstd).mul_(aw).add_(ab).add_(f64(c.r64).abs_());
  return h.add_(d.abs_().add_(mabs).mul_(rstd).mul_(aw).mul_(g));
}

// Backward. grad_input (j = 0), with a = w dy and xhat = (x - mean) rstd from the given (float)
// mean and rstd: x - mean rounds relative to itself, so xhat is exact to a few ulp.
// grad_input = rstd (a - mean(a) - xhat mean(a xhat)): rstd (|a| + g mean|a| + (1 + g) |xhat|
// mean|a xhat|). Eager's form b x + c (b and c from sum(a x)) cancels where |x| >> |x - mean| and
// is outside this on offset rows: the cap holds there. grad_weight (j = 1) sums dy xhat over the
// rows, grad_bias (j = 2) dy: this chunk's sum |dy xhat| or sum |dy|, [1, n] (the caller adds
// |r64| + sqrt(rows) sum).
at::Tensor layer_norm_backward_scale(const OpCall&, const Chunk& c, size_t j, const RowLayout& l) {
  const int64_t n = l.k;
  if (j > 0) {
    at::Tensor dy = f64(c.in[0]).abs_();
    if (j == 2) return dy.sum(0, true);
    at::Tensor xh = (f64(c.in[1]) - f64(c.in[2]).reshape({-1, 1})).mul_(f64(c.in[3]).reshape({-1, 1})).abs_();
    return dy.mul_(xh).sum(0, true);
  }
  at::Tensor dy = f64(c.in[0]), x = f64(c.in[1]);
  at::Tensor mean = f64(c.in[2]).reshape({-1, 1}), rstd = f64(c.in[3]).reshape({-1, 1});
  const double g = std::sqrt(static_cast<double>(n));
  at::Tensor xh = (x - mean).mul_(rstd).abs_();
  at::Tensor aa = (param_of(c.in[4], n, 1.0, x) * dy).abs_();
  at::Tensor h = xh * (aa * xh).mean(1, true).mul_(1 + g);
  return h.add_(aa.mean(1, true).mul_(g)).add_(aa).mul_(rstd).add_(f64(c.r64).abs_());
}

}  // namespace

// Offset rows sit at N(100, 1): a mean far from zero, where a one-pass variance cancels.
extern const FamilyReference kLayerNormReference{&layer_norm_eager, &kReductionKinds, 1e3, 100.0, nullptr,
                                                 &layer_norm_layout, &layer_norm_view, &layer_norm_scale, false, nullptr};
extern const FamilyReference kLayerNormBackwardReference{
    &layer_norm_backward_eager, &kReductionKinds, 1e3, 100.0, &layer_norm_backward_derive,
    &layer_norm_layout, &layer_norm_backward_view, &layer_norm_backward_scale, false, nullptr};

}  // namespace kc::evolve
