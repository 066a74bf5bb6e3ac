// aten::rms_norm (F.rms_norm, nn.RMSNorm) caught above autograd as one call (docs/DESIGN.md
// "Composites above autograd"). PyTorch runs it as a composite: on CPU a chain of pow, mean, add,
// rsqrt and mul kernels forward and as many backward; on CUDA, in recent torch, _fused_rms_norm.
// Here a served pair of kernelcraft operators (evolve/ops/rms_norm.h) runs instead: a fused
// forward that returns the output and one fp32 rstd per row, and a C++ autograd node that saves
// the input, the weight and rstd, whose backward writes grad_input and grad_weight.
//
// PyTorch's composite runs, bit for bit, whenever the call is not a plain eager one (see
// cross_entropy.cpp: subclasses, fake tensors, dispatch modes, forward AD), a shape is symbolic,
// the weight's dtype is not the input's (eager's own promotion rules then apply), or the pair is
// not ready. Under CUDA autocast rms_norm is on autocast's fp32 list: autocast has already cast
// the input when this kernel runs, so eager's and the pair's dtypes agree without a flag.
#include <ATen/ATen.h>
#include <ATen/ops/rms_norm_compositeimplicitautograd_dispatch.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <limits>
#include <numeric>

#include "dispatcher/call.h"
#include "dispatcher/composite.h"

namespace kc::dispatch {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

struct RmsArgs {
  const at::Tensor& input;
  const at::Tensor& weight;   // undefined when absent
  std::vector<int64_t> shape;  // normalized_shape
  double eps;
  std::array<int64_t, 2> mask{1, 0};   // backward: grad_input, grad_weight wanted

  std::vector<int64_t> stat_sizes() const {
    std::vector<int64_t> s(input.sizes().begin(), input.sizes().end() - static_cast<long>(shape.size()));
    s.resize(input.dim(), 1);
    return s;
  }
  void bind_forward(Call& c) const {
    c.t("input", input);
    c.t("weight", weight);
    c.list("normalized_shape", shape);
    c.d("eps", eps);
  }
  void bind_backward(Call& c, const at::Tensor& grad, const at::Tensor& rstd) const {
    c.t("grad", grad);
    c.t("input", input);
    c.t("rstd", rstd);
    c.t("weight", weight);
    c.list("normalized_shape", shape);
    c.d("eps", eps);
    c.list("output_mask", mask);
  }
  std::optional<at::Tensor> weight_opt() const { return weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt; }
};

// The calls the pair takes: a plain eager call in f32 / bf16 / f16 whose weight, if any, is
// normalized_shape in the input's dtype.
bool eligible(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef shape) {
  if (!no_dispatch_mode() || !x.defined() || !plain_tensor(x, x) || !plain_tensor(w, x)) return false;
  const at::ScalarType s = x.scalar_type();
  if (s != at::kFloat && s != at::kBFloat16 && s != at::kHalf) return false;
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0 || nd > x.dim() || x.numel() == 0) return false;
  if (!std::equal(shape.begin(), shape.end(), x.sizes().end() - nd)) return false;
  return !w.defined() || (w.scalar_type() == s && w.sizes() == shape);
}

// Eager for the backward key: the composite's own autograd, run again from the saved input and
// weight (only while the backward's kernel cannot answer).
std::tuple<at::Tensor, at::Tensor> eager_backward(const RmsArgs& a, const at::Tensor& grad) {
  c10::AutoGradMode grad_on(true);
  at::Tensor x = a.input.detach().requires_grad_(a.mask[0] != 0);
  at::Tensor w = a.weight.defined() ? a.weight.detach().requires_grad_(a.mask[1] != 0) : at::Tensor();
  const at::Tensor out = at::compositeimplicitautograd::rms_norm_symint(x, c10::fromIntArrayRefSlow(a.shape),
                                                     w.defined() ? std::optional<at::Tensor>(w) : std::nullopt, a.eps);
  std::vector<at::Tensor> leaves;
  if (a.mask[0]) leaves.push_back(x);
  if (a.mask[1]) leaves.push_back(w);
  auto g = torch::autograd::grad({out}, leaves, {grad});
  return {a.mask[0] ? g[0] : at::Tensor(), a.mask[1] ? g.back() : at::Tensor()};
}

struct RmsNormNode : torch::autograd::Node {
  SavedVariable input_, weight_, rstd_;
  std::vector<int64_t> shape_;
  double eps_ = 0;
  std::array<int64_t, 2> mask_{1, 0};

  std::string name() const override { return "KernelcraftRmsNormBackward"; }
  void release_variables() override {
    input_.reset_data();
    weight_.reset_data();
    rstd_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor input = input_.unpack(), weight = weight_.unpack(), rstd = rstd_.unpack();
    const RmsArgs a{input, weight, shape_, eps_, mask_};
    const at::Tensor grad = grads[0].contiguous();
    Call c(OpId::kRmsNormBackward, input.is_cuda() ? Dev::kCuda : Dev::kCpu, grad);
    if (c.active()) a.bind_backward(c, grad, rstd);
    auto [gi, gw] = c.run<std::tuple<at::Tensor, at::Tensor>>([&] { return eager_backward(a, grad); });
    return {gi, gw};
  }
};

at::Tensor attach_node(const RmsArgs& a, at::Tensor out, const at::Tensor& rstd) {
  RmsNormNode* node = nullptr;
  const NodePtr owner = new_node(node);
  node->set_next_edges(torch::autograd::collect_next_edges(a.input, a.weight));
  node->input_ = SavedVariable(a.input, false);
  node->weight_ = SavedVariable(a.weight, false);
  node->rstd_ = SavedVariable(rstd, false);
  node->shape_ = a.shape;
  node->eps_ = a.eps;
  node->mask_ = a.mask;
  torch::autograd::set_history(out, owner);
  return out;
}

// Whether the backward key (grad and rstd as placeholders of their metadata) is ready; a first
// miss requests its evolution, without captured inputs.
bool backward_ready(const RmsArgs& a, Dev dev) {
  const at::Tensor grad = at::empty(a.input.sizes(), a.input.options());
  const at::Tensor rstd = at::empty(a.stat_sizes(), a.input.options().dtype(at::kFloat));
  Call c(OpId::kRmsNormBackward, dev, grad);
  if (!c.active()) return false;
  a.bind_backward(c, grad, rstd);
  return c.ready(/*capture=*/false);
}

at::Tensor rms_norm_kernel(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                           const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  static const at::Tensor undefined;
  const at::Tensor& w = weight.has_value() ? *weight : undefined;
  auto own = [&] { return at::compositeimplicitautograd::rms_norm_symint(input, normalized_shape, weight, eps); };
  const auto shape = c10::asIntArrayRefSlowOpt(normalized_shape);   // nullopt: symbolic (tracing)
  if (!shape || !eligible(input, w, *shape)) return own();
  // eager's default: the opmath type's epsilon, fp32's for these dtypes
  RmsArgs a{input, w, shape->vec(), eps.value_or(std::numeric_limits<float>::epsilon())};
  const bool want_x = input.requires_grad(), want_w = w.defined() && w.requires_grad();
  const bool grad = c10::GradMode::is_enabled() && (want_x || want_w);
  a.mask = {want_x, want_w};
  const Dev dev = input.is_cuda() ? Dev::kCuda : Dev::kCpu;
  auto bwd = [&] { return !grad || backward_ready(a, dev); };
  Call c(OpId::kRmsNorm, dev, input);
  if (!c.active()) return own();
  a.bind_forward(c);
  auto eager = [&]() -> std::tuple<at::Tensor, at::Tensor> {
    at::Tensor out = own();
    const at::Tensor rstd = at::empty(a.stat_sizes(), input.options().dtype(at::kFloat));
    if (!c.compares()) return {out, rstd};
    c10::NoGradGuard no_grad;
    std::vector<int64_t> dims(a.shape.size());
    std::iota(dims.begin(), dims.end(), input.dim() - static_cast<int64_t>(a.shape.size()));
    return {out, input.to(at::kFloat).square().mean(dims, true).add_(a.eps).rsqrt_()};
  };
  return serve_forward(c, bwd, grad, own, eager,
                       [&](at::Tensor out, const at::Tensor& rstd) { return attach_node(a, std::move(out), rstd); });
}

}  // namespace

void register_rms_norm() {
  impl_above_autograd("rms_norm", TORCH_FN(rms_norm_kernel), __FILE__, __LINE__);
}

}  // namespace kc::dispatch
