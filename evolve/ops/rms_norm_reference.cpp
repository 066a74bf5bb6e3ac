// RMSNorm forward and backward, torch half: eager references (at::rms_norm, the composite
// kernelcraft replaces, and its autograd), the backward's rstd made by the forward (the pair is
// verified as it runs in training) and the error model of a reduction over the flattened
// normalized dims (layer norm's, without the mean: layer_norm_reference.cpp).
#include "evolve/ops/reference.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <numeric>

#include "evolve/ops/rms_norm.h"

namespace kc::evolve {
namespace {

const std::vector<std::string> kRmsKinds = {"normal", "large", "offset", "extreme"};

// rstd as the fused forward computes it: fp32 (fp64 for the fp64 reference run).
at::Tensor rstd_of(const OpCall& c, const at::Tensor& x, double eps) {
  const int64_t nd = static_cast<int64_t>(c.list_arg("normalized_shape").size());
  std::vector<int64_t> dims(nd);
  std::iota(dims.begin(), dims.end(), x.dim() - nd);
  const at::Tensor xf = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  return xf.square().mean(dims, /*keepdim=*/true).add_(eps).rsqrt_();
}

std::vector<at::Tensor> rms_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto g = rms_norm_geometry(c);
  if (!g.is_ok()) return {};
  return {at::rms_norm(in[0], c.list_arg("normalized_shape"), opt(in[1]), g->eps), rstd_of(c, in[0], g->eps)};
}

// grad_input and grad_weight by eager's own autograd through the composite.
std::vector<at::Tensor> rms_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto g = rms_norm_geometry(c);
  if (!g.is_ok()) return {};
  c10::AutoGradMode grad_on(true);
  at::Tensor x = in[1].detach().requires_grad_(g->want_input);
  at::Tensor w = in[3].defined() ? in[3].detach().requires_grad_(g->want_weight) : at::Tensor();
  at::Tensor out = at::rms_norm(x, c.list_arg("normalized_shape"), opt(w), g->eps);
  std::vector<at::Tensor> leaves;
  if (g->want_input) leaves.push_back(x);
  if (g->want_weight) leaves.push_back(w);
  auto grads = torch::autograd::grad({out}, leaves, {in[0]});
  at::Tensor gi = g->want_input ? grads[0] : at::Tensor();
  at::Tensor gw = g->want_weight ? grads.back() : at::Tensor();
  return {gi, gw};
}

// The user's eager: the composite's output alone (no rstd), and its backward without the
// forward it recomputes above.
at::Tensor rms_forward(const OpCall& c, const std::vector<at::Tensor>& in) {
  return at::rms_norm(in[0], c.list_arg("normalized_shape"), opt(in[1]), c.double_arg("eps", 1e-6));
}
void rms_timed(const OpCall& c, const std::vector<at::Tensor>& in) { rms_forward(c, in); }
void rms_backward_timed(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto g = rms_norm_geometry(c);
  if (g.is_ok()) backward_only({in[1], in[3]}, {g->want_input, g->want_weight}, in[0], &rms_forward, c);
}

// The forward's rstd of the drawn input.
void rms_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  auto g = rms_norm_geometry(c);
  if (g.is_ok()) in[2].copy_(rstd_of(c, in[1], g->eps).view(in[2].sizes()));
}

RowLayout rms_layout(const OpCall& c, const std::vector<at::Tensor>&, size_t j) {
  RowLayout l;
  l.model = true;
  for (int64_t v : c.list_arg("normalized_shape")) l.k *= std::max<int64_t>(1, v);
  l.dim = -1;
  l.stat = c.op == OpId::kRmsNorm && j > 0;
  l.col = c.op == OpId::kRmsNormBackward && j > 0;
  l.rounds_once = true;   // fp32 arithmetic, each half output rounded once
  return l;
}

RowView rms_view(size_t k) { return k == 0 ? RowView::kRows : RowView::kWhole; }
RowView rms_backward_view(size_t k) { return k < 2 ? RowView::kRows : k == 2 ? RowView::kStat : RowView::kWhole; }

at::Tensor weight_of(const at::Tensor& t, int64_t n, const at::Tensor& like) {
  return t.defined() ? f64(t).reshape({1, n}) : at::ones({1, n}, like.options().dtype(at::kDouble));
}

// Forward. The mean square sums positive terms (g = sqrt(n)): rstd (1 + g ms / (ms + eps)).
// The output rounds x rstd w and carries rstd's error: |x| rstd |w| (1 + g) + |y|.
at::Tensor rms_scale(const OpCall& call, const Chunk& c, size_t j, const RowLayout& l) {
  const int64_t n = l.k;
  const double eps = call.double_arg("eps", 1e-6), g = std::sqrt(static_cast<double>(n));
  at::Tensor x = f64(c.in[0]);
  at::Tensor ms = x.square().mean(1, true), rstd = (ms + eps).rsqrt();
  if (j == 1) return rstd * (1 + g * ms / (ms + eps));
  return x.abs_().mul_(rstd).mul_(weight_of(c.in[1], n, x).abs_()).mul_(1 + g).add_(f64(c.r64).abs_());
}

// Backward, from the given (fp32) rstd, so xhat = x rstd is exact to a few ulp. grad_input
// (j = 0) = rstd (a - xhat mean(a xhat)), a = w dy: rstd (|a| + (1 + g) |xhat| mean|a xhat|).
// grad_weight (j = 1) sums dy xhat over the rows: this chunk's sum |dy xhat|, [1, n] (the caller
// adds |r64| + sqrt(rows) sum).
at::Tensor rms_backward_scale(const OpCall&, const Chunk& c, size_t j, const RowLayout& l) {
  const int64_t n = l.k;
  at::Tensor dy = f64(c.in[0]), rstd = f64(c.in[2]).reshape({-1, 1});
  at::Tensor xh = f64(c.in[1]).mul_(rstd).abs_();
  if (j > 0) return dy.abs_().mul_(xh).sum(0, true);
  const double g = std::sqrt(static_cast<double>(n));
  at::Tensor aa = (weight_of(c.in[3], n, dy) * dy).abs_();
  at::Tensor h = xh * (aa * xh).mean(1, true).mul_(1 + g);
  return h.add_(aa).mul_(rstd).add_(f64(c.r64).abs_());
}

}  // namespace

extern const FamilyReference kRmsNormReference{&rms_eager, &kRmsKinds, 1e3, 100.0, nullptr,
                                               &rms_layout, &rms_view, &rms_scale, false, nullptr, &rms_timed};
extern const FamilyReference kRmsNormBackwardReference{&rms_backward_eager, &kRmsKinds, 1e3, 100.0,
                                                       &rms_backward_derive, &rms_layout, &rms_backward_view,
                                                       &rms_backward_scale, false, nullptr, &rms_backward_timed};

}  // namespace kc::evolve
