// Group norm backward, torch half: the eager reference, mean and rstd as the forward saved them,
// and the error model, computed over the whole call (`whole`, as batch norm backward's): grad_input
// reduces over each (n, group) row of K = C / group x HxW values, grad_weight / grad_bias over the
// M = N x HxW values of a channel, and neither is one row of the lead input.
#include "evolve/ops/reference.h"

#include <array>
#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme"};

std::vector<at::Tensor> group_norm_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto m = c.list_arg("output_mask");
  std::array<bool, 3> mask = {m.size() > 0 && m[0], m.size() > 1 && m[1], m.size() > 2 && m[2]};
  auto r = at::native_group_norm_backward(in[0], in[1], in[2], in[3], opt(in[4]), c.int_arg("N", 0), c.int_arg("C", 0),
                                          c.int_arg("HxW", 0), c.int_arg("group", 1), mask);
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

// mean and rstd from the forward on the drawn input (eps 1e-5, the module's default), in the
// dtype the forward gives them, which is the call's.
void group_norm_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  auto s = at::native_group_norm(in[1], opt(in[4]), std::nullopt, c.int_arg("N", 0), c.int_arg("C", 0),
                                 c.int_arg("HxW", 0), c.int_arg("group", 1), 1e-5);
  in[2].copy_(std::get<1>(s).view(in[2].sizes()));
  in[3].copy_(std::get<2>(s).view(in[3].sizes()));
}

// With x as [N, G, D, HW], mean and rstd [N, G, 1, 1], xhat = (x - mean) rstd (exact to a few ulp:
// x - mean rounds relative to itself), and sums in any order:
//   grad_bias   (g + 1) sum|dy| + |gb| over a channel's M terms, g = sqrt(M);
//   grad_weight (g + 3) sum|dy xhat| + |gw| (xhat's three roundings inside each term);
//   grad_input  rstd (|w dy| + h mean|w dy| + (1 + h) |xhat| mean|w dy xhat|) + |gi| with
//     h = sqrt(K), the row's mean over its K terms: layer norm backward's model per row, eager's
//     form rstd (w dy - mean(w dy) - xhat mean(w dy xhat)).
at::Tensor group_norm_backward_whole(const OpCall& call, const std::vector<at::Tensor>& in, size_t j) {
  const int64_t N = call.int_arg("N", 0), C = call.int_arg("C", 0), HW = call.int_arg("HxW", 1);
  const int64_t G = std::max<int64_t>(1, call.int_arg("group", 1)), D = C / G;
  at::Tensor dy = f64(in[0]).reshape({N, G, D, HW}), x = f64(in[1]).reshape({N, G, D, HW});
  at::Tensor xh = (x - f64(in[2]).reshape({N, G, 1, 1})).mul_(f64(in[3]).reshape({N, G, 1, 1}));
  const std::array<int64_t, 2> cdims{0, 3}, rdims{2, 3};   // an IntArrayRef over a braced list would dangle
  const at::IntArrayRef chan(cdims), row(rdims);
  const double g = std::sqrt(static_cast<double>(N * HW)), h = std::sqrt(static_cast<double>(D * HW));
  if (j == 2) return dy.abs().sum(chan).mul_(g + 1).add_(dy.sum(chan).abs_()).reshape({C});
  if (j == 1) {
    at::Tensor dx = dy * xh;
    return dx.abs().sum(chan).mul_(g + 3).add_(dx.sum(chan).abs_()).reshape({C});
  }
  at::Tensor wdy = in[4].defined() ? dy.mul_(f64(in[4]).reshape({1, G, D, 1})) : dy;
  at::Tensor rs = f64(in[3]).reshape({N, G, 1, 1});
  at::Tensor p = wdy * xh;
  at::Tensor gi = (wdy - wdy.mean(row, true) - xh * p.mean(row, true)).mul_(rs).abs_();
  at::Tensor m = xh.abs_().mul_(p.abs_().mean(row, true).mul_(1 + h)).add_(wdy.abs().mean(row, true).mul_(h));
  return m.add_(wdy.abs()).mul_(rs.abs()).add_(gi).reshape(in[1].sizes());
}

// A reduction (numerics treats it as one); the model itself is group_norm_backward_whole. Every
// output is computed in fp32 and rounded once to its dtype (CUDA eager's accumulate type).
RowLayout group_norm_backward_layout(const OpCall&, const std::vector<at::Tensor>&, size_t) {
  RowLayout l;
  l.model = true;
  l.rounds_once = true;
  return l;
}
RowView group_norm_backward_view(size_t) { return RowView::kWhole; }

}  // namespace

// Offset inputs sit at N(100, 1): x - mean cancels where eager's uncentred sum dy x loses it.
extern const FamilyReference kGroupNormBackwardReference{
    &group_norm_backward_eager, &kReductionKinds, 1e3, 100.0, &group_norm_backward_derive,
    &group_norm_backward_layout, &group_norm_backward_view, nullptr, false, &group_norm_backward_whole};

}  // namespace kc::evolve
