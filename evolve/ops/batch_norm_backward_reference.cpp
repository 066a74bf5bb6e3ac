// Batch norm backward, torch half: the eager reference, inputs as the forward saved them, and
// the error model of per-channel sums over the M = N x HxW values of a channel, computed over the
// whole call (`whole`, as the forward's): a channel's values are not one row of the lead input.
#include "evolve/ops/reference.h"

#include <array>
#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme"};

bool train(const OpCall& c) { return c.int_arg("train", 1) != 0; }

std::vector<at::Tensor> batch_norm_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto m = c.list_arg("output_mask");
  std::array<bool, 3> mask = {m.size() > 0 && m[0], m.size() > 1 && m[1], m.size() > 2 && m[2]};
  auto r = at::native_batch_norm_backward(in[0], in[1], opt(in[2]), opt(in[3]), opt(in[4]), opt(in[5]), opt(in[6]),
                                          train(c), c.double_arg("eps", 1e-5), mask);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

// Training: save_mean / save_invstd are the batch's, as the forward saved them. Eval: a positive
// running variance, and (CUDA, where they are [C]) the saved statistics the eval forward writes,
// mean = running_mean and invstd = 1 / sqrt(running_var + eps), which CUDA's eager may read.
void batch_norm_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  const double eps = c.double_arg("eps", 1e-5);
  if (train(c)) {
    auto s = at::native_batch_norm(in[1], std::nullopt, std::nullopt, std::nullopt, std::nullopt, true, 0.1, eps);
    in[5].copy_(std::get<1>(s));
    in[6].copy_(std::get<2>(s));
    return;
  }
  in[4].abs_().add_(0.1);
  if (in[5].numel() == 0) return;
  in[5].copy_(in[3]);
  in[6].copy_(in[4].to(at::kDouble).add(eps).rsqrt_());
}

// A per-channel tensor as [1, C, 1] in fp64 (fill where absent).
at::Tensor chan(const at::Tensor& t, int64_t C, double fill, const at::Tensor& like) {
  return t.defined() ? f64(t).reshape({1, C, 1}) : at::full({1, C, 1}, fill, like.options().dtype(at::kDouble));
}

// The channel's mean and invstd the call normalizes with ([1, C, 1], fp64).
std::pair<at::Tensor, at::Tensor> stats(const OpCall& call, const std::vector<at::Tensor>& in, const at::Tensor& x) {
  const int64_t C = x.size(1);
  if (train(call)) return {chan(in[5], C, 0.0, x), chan(in[6], C, 1.0, x)};
  return {chan(in[3], C, 0.0, x), chan(in[4], C, 1.0, x).add_(call.double_arg("eps", 1e-5)).rsqrt_()};
}

// With g = sqrt(M), sums in any order over the channel's M terms (x - mean rounds relative to
// itself, so xhat is exact to a few ulp):
//   grad_bias   (g + 1) sum|dy| + |gb|;
//   grad_weight (g + 3) sum|dy xhat| + |gw| (xhat's own roundings, three, inside each term);
//   grad_input, training: invstd |w| (|dy| + g mean|dy| + (1 + g) |xhat| mean|dy xhat|) + |gi|
//     (layer norm backward's model per channel, eager's form (dy - mean_dy - xmu k) invstd w);
//   grad_input, eval: dy w invstd, elementwise: 4 |gi| (invstd, w invstd, the product).
at::Tensor batch_norm_backward_whole(const OpCall& call, const std::vector<at::Tensor>& in, size_t j) {
  const int64_t N = in[1].size(0), C = in[1].size(1);
  at::Tensor dy = f64(in[0]).reshape({N, C, -1}), x = f64(in[1]).reshape({N, C, -1});
  const std::array<int64_t, 2> dims{0, 2};   // an IntArrayRef over a braced list would dangle
  const at::IntArrayRef red(dims);
  const double M = static_cast<double>(x.numel() / std::max<int64_t>(C, 1)), g = std::sqrt(M);
  auto [mean, is] = stats(call, in, x);
  at::Tensor xh = (x - mean).mul_(is);
  if (j == 2) return dy.abs().sum(red).mul_(g + 1).add_(dy.sum(red).abs_());
  at::Tensor dx = dy * xh;
  if (j == 1) return dx.abs().sum(red).mul_(g + 3).add_(dx.sum(red).abs_());
  at::Tensor a = chan(in[2], C, 1.0, x).mul_(is);   // w invstd
  if (!train(call)) return (dy * a).abs_().mul_(4).reshape(in[1].sizes());
  at::Tensor mdy = dy.mean(red, true), mdx = dx.mean(red, true);
  at::Tensor gi = (dy - mdy - xh * mdx).mul_(a).abs_();
  at::Tensor h = xh.abs().mul_(dx.abs().mean(red, true).mul_(1 + g)).add_(dy.abs().mean(red, true).mul_(g)).add_(dy.abs());
  return h.mul_(a.abs()).add_(gi).reshape(in[1].sizes());
}

// A reduction (numerics treats it as one); the model itself is batch_norm_backward_whole. Every
// output is computed in fp32 and rounded once to its dtype (CUDA eager's accumulate type).
RowLayout batch_norm_backward_layout(const OpCall&, const std::vector<at::Tensor>&, size_t) {
  RowLayout l;
  l.model = true;
  l.rounds_once = true;
  return l;
}
RowView batch_norm_backward_view(size_t) { return RowView::kWhole; }

}  // namespace

// Offset inputs sit at N(100, 1): x - mean cancels where a one-pass form would lose it.
extern const FamilyReference kBatchNormBackwardReference{
    &batch_norm_backward_eager, &kReductionKinds, 1e3, 100.0, &batch_norm_backward_derive,
    &batch_norm_backward_layout, &batch_norm_backward_view, nullptr, false, &batch_norm_backward_whole};

}  // namespace kc::evolve
