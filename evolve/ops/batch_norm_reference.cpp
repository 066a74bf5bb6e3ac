// Batch norm forward, torch half: the eager reference (running statistics cloned, since training
// updates them in place), positive running variances, and the error model of a per-channel
// reduction over N x HxW strided elements, computed over the whole call (`whole`): the row
// machinery cuts the lead input along one axis, and a channel's elements are not one row.
#include "evolve/ops/reference.h"

#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme"};

bool training(const OpCall& c) { return c.int_arg("training", 1) != 0; }

// Clones of the running statistics: a training call writes them, and repeated references (and
// the kernel's own run) must see the same values.
std::vector<at::Tensor> batch_norm_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto clone = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t.clone()) : std::nullopt; };
  auto r = at::native_batch_norm(in[0], opt(in[1]), opt(in[2]), clone(in[3]), clone(in[4]), training(c),
                                 c.double_arg("momentum", 0.1), c.double_arg("eps", 1e-5));
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

// A variance is positive: |v| + 0.1 keeps eval's 1 / sqrt(var + eps) finite on every kind.
void batch_norm_derive(const OpCall&, std::vector<at::Tensor>& in, at::Device) {
  if (in.size() > 4 && in[4].defined()) in[4].abs_().add_(0.1);
}

// A per-channel parameter as [1, C, 1] in fp64 (fill where absent).
at::Tensor chan(const at::Tensor& t, int64_t C, double fill, const at::Tensor& like) {
  return t.defined() ? f64(t).reshape({1, C, 1}) : at::full({1, C, 1}, fill, like.options().dtype(at::kDouble));
}

// Eval: elementwise y = (x - rm) invstd w + b with invstd = 1 / sqrt(rv + eps): each term rounds
// once, (|x| + |rm|) |invstd w| + |b| + |y|. save_mean copies rm, save_invstd rounds once.
at::Tensor eval_scale(const OpCall& call, const std::vector<at::Tensor>& in, size_t j, const at::Tensor& x) {
  const int64_t C = x.size(1);
  const double eps = call.double_arg("eps", 1e-5);
  at::Tensor rm = chan(in[3], C, 0.0, x), is = chan(in[4], C, 1.0, x).add_(eps).rsqrt_();
  if (j == 1) return rm.abs().reshape({C});
  if (j == 2) return is.reshape({C});
  at::Tensor a = is.mul_(chan(in[1], C, 1.0, x)), b = chan(in[2], C, 0.0, x);
  at::Tensor y = (x - rm).mul_(a).add_(b).abs_();
  return x.abs().add_(rm.abs_()).mul_(a.abs()).add_(b.abs()).add_(y);
}

// Training: layer norm's model (layer_norm_reference.cpp) per channel over count = N x HxW
// elements, g = sqrt(count): mean |mean| + g mean|x|; invstd invstd (1 + g var / (var + eps));
// out (|x| + |mean|) invstd |w| + |b| + |y| + g invstd |w| (mean|x| + |x - mean|).
at::Tensor batch_norm_whole(const OpCall& call, const std::vector<at::Tensor>& in, size_t j) {
  if (j < call.outputs.size() && call.outputs[j].numel() == 0)   // the CPU's empty eval statistics
    return at::empty({0}, in[0].options().dtype(at::kDouble));
  const int64_t N = in[0].size(0), C = in[0].size(1);
  at::Tensor x = f64(in[0]).reshape({N, C, -1});
  if (!training(call)) {
    at::Tensor h = eval_scale(call, in, j, x);
    return j == 0 ? h.reshape(in[0].sizes()) : h;
  }
  const double g = std::sqrt(static_cast<double>(x.numel() / std::max<int64_t>(C, 1)));
  const double eps = call.double_arg("eps", 1e-5);
  at::Tensor mean = x.mean(at::IntArrayRef{0, 2}, true), mabs = x.abs().mean(at::IntArrayRef{0, 2}, true);
  if (j == 1) return mean.abs_().add_(mabs.mul_(g)).reshape({C});
  at::Tensor d = x - mean;
  at::Tensor var = d.square().mean(at::IntArrayRef{0, 2}, true), is = (var + eps).rsqrt();
  if (j == 2) return (var / (var + eps)).mul_(g).add_(1).mul_(is).reshape({C});
  at::Tensor aw = chan(in[1], C, 1.0, x).abs_(), b = chan(in[2], C, 0.0, x);
  at::Tensor y = (d * is).mul_(chan(in[1], C, 1.0, x)).add_(b).abs_();
  at::Tensor h = (x.abs_() + mean.abs()).mul_(is * aw).add_(b.abs()).add_(y);
  return h.add_(d.abs_().add_(mabs).mul_(is * aw * g)).reshape(in[0].sizes());
}

// A reduction (so numerics treats it as one, e.g. no elementwise denormal allowance); the model
// itself is batch_norm_whole, which the error model uses before any row layout.
RowLayout batch_norm_layout(const OpCall&, const std::vector<at::Tensor>&, size_t) {
  RowLayout l;
  l.model = true;
  return l;
}
RowView batch_norm_view(size_t) { return RowView::kWhole; }

}  // namespace

// Offset inputs sit at N(100, 1): means far from zero, where a one-pass variance cancels.
extern const FamilyReference kBatchNormReference{&batch_norm_eager, &kReductionKinds, 1e3, 100.0, &batch_norm_derive,
                                                 &batch_norm_layout, &batch_norm_view, nullptr, false, &batch_norm_whole};

}  // namespace kc::evolve
