// aten::cross_entropy_loss caught above autograd as one call (docs/DESIGN.md "Composites above
// autograd"). PyTorch runs it as a composite (log_softmax, nll_loss and their backwards), which
// keeps a log-probability tensor the size of the logits until backward. Here a served pair of
// kernelcraft operators (evolve/ops/cross_entropy.h) runs instead: a fused forward that returns
// the loss and one log-sum-exp per row, and a C++ autograd node that saves only the logits, the
// target, the weight and that statistic, whose backward writes the logits' gradient once.
//
// PyTorch's own composite runs, bit for bit, whenever the call is not a plain eager one (tensor
// subclasses, functorch, functionalization, fake tensors: torch.compile's tracing; a dispatch
// mode; forward AD; a target or weight that wants a gradient; a shape the pair does not take) or
// the pair is not ready: the forward's key has no kernel, or the backward's when a gradient will
// be needed. A first miss of either key requests both keys' evolution.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/cross_entropy_loss_native.h>
#include <ATen/ops/logsumexp_compositeexplicitautograd_dispatch.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <memory>

#include "dispatcher/call.h"
#include "dispatcher/composite.h"
#include "dispatcher/state.h"

namespace kc::dispatch {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// What the pair's key binds, in the kernelcraft operators' schema order (cross_entropy.h).
struct CeArgs {
  const at::Tensor& self;
  const at::Tensor& target;
  const at::Tensor& weight;   // undefined when absent
  int64_t reduction, ignore_index;
  double label_smoothing;
  bool upcast;                // CUDA autocast on reduced-precision logits: eager computes in fp32

  void bind(Call& c) const {
    c.t("self", self);
    c.t("target", target);
    c.t("weight", weight);
  }
  void bind_scalars(Call& c) const {
    c.i("reduction", reduction);
    c.i("ignore_index", ignore_index);
    c.d("label_smoothing", label_smoothing);
    c.b("upcast", upcast);
  }
  std::optional<at::Tensor> weight_opt() const { return weight.defined() ? std::optional<at::Tensor>(weight) : std::nullopt; }
  at::ScalarType loss_type() const { return upcast ? at::kFloat : self.scalar_type(); }
  std::vector<int64_t> lse_sizes() const {
    return self.dim() == 2 ? std::vector<int64_t>{self.size(0)} : std::vector<int64_t>{};
  }
  std::vector<int64_t> loss_sizes() const {
    return reduction == at::Reduction::None ? lse_sizes() : std::vector<int64_t>{};
  }
};

at::Tensor composite(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                     int64_t reduction, const c10::SymInt& ignore_index, double label_smoothing) {
  return at::native::cross_entropy_loss_symint(self, target, weight, reduction, ignore_index, label_smoothing);
}

// The calls the pair takes: a plain eager call of [N, C] or [C] logits in f32 / bf16 / f16 with
// int64 classes or probabilities, whose target and weight want no gradient.
bool eligible(const at::Tensor& self, const at::Tensor& target, const at::Tensor& weight) {
  if (!no_dispatch_mode()) return false;
  if (!self.defined() || !target.defined() || !plain_tensor(self, self) || !plain_tensor(target, self) ||
      !plain_tensor(weight, self))
    return false;
  const at::ScalarType s = self.scalar_type();
  if (s != at::kFloat && s != at::kBFloat16 && s != at::kHalf) return false;
  if (self.dim() != 1 && self.dim() != 2) return false;
  if (target.requires_grad() || (weight.defined() && (weight.requires_grad() || weight.dim() != 1))) return false;
  return target.scalar_type() == at::kLong || target.is_floating_point();
}

// Eager for the backward key: the composite's own autograd, run again from the saved logits
// (only while the backward's kernel cannot answer). With upcast the forward ran under CUDA
// autocast; the backward may run on another thread without it, so autocast is turned on for the
// recomputation (the worker's reference does the same: evolve/ops/cross_entropy_reference.cpp).
at::Tensor eager_backward(const CeArgs& a, const at::Tensor& grad) {
  c10::AutoGradMode grad_on(true);
  at::Tensor leaf = a.self.detach().requires_grad_(true), loss;
  {
    const CudaAutocast autocast(a.upcast);
    loss = composite(leaf, a.target, a.weight_opt(), a.reduction, a.ignore_index, a.label_smoothing);
  }
  return torch::autograd::grad({loss}, {leaf}, {grad.to(loss.scalar_type())})[0].to(a.self.scalar_type());
}

at::Tensor run_backward(const CeArgs& a, const at::Tensor& grad, const at::Tensor& lse) {
  const Dev dev = a.self.is_cuda() ? Dev::kCuda : Dev::kCpu;
  Call c(OpId::kCrossEntropyBackward, dev, grad);
  if (c.active()) {
    c.t("grad", grad);
    a.bind(c);
    c.t("lse", lse);
    a.bind_scalars(c);
  }
  return c.run<at::Tensor>([&] { return eager_backward(a, grad); });
}

// The pair's backward: saves the logits, the target, the weight and the forward's lse.
struct CrossEntropyNode : torch::autograd::Node {
  SavedVariable self_, target_, weight_, lse_;
  int64_t reduction_ = 1, ignore_index_ = -100;
  double label_smoothing_ = 0;
  bool upcast_ = false;

  std::string name() const override { return "KernelcraftCrossEntropyBackward"; }
  void release_variables() override {
    self_.reset_data();
    target_.reset_data();
    weight_.reset_data();
    lse_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {at::Tensor()};
    const at::Tensor self = self_.unpack(), target = target_.unpack(), weight = weight_.unpack(), lse = lse_.unpack();
    const CeArgs a{self, target, weight, reduction_, ignore_index_, label_smoothing_, upcast_};
    const at::Tensor grad = grads[0].contiguous();
    return {run_backward(a, grad, lse)};
  }
};

at::Tensor attach_node(const CeArgs& a, at::Tensor loss, const at::Tensor& lse) {
  CrossEntropyNode* node = nullptr;
  const NodePtr owner = new_node(node);
  node->set_next_edges(torch::autograd::collect_next_edges(a.self));
  node->self_ = SavedVariable(a.self, false);
  node->target_ = SavedVariable(a.target, false);
  node->weight_ = SavedVariable(a.weight, false);
  node->lse_ = SavedVariable(lse, false);
  node->reduction_ = a.reduction;
  node->ignore_index_ = a.ignore_index;
  node->label_smoothing_ = a.label_smoothing;
  node->upcast_ = a.upcast;
  torch::autograd::set_history(loss, owner);
  return loss;
}

// Whether the backward key (at forward time: grad and lse as placeholders of their metadata) is
// ready; a first miss requests its evolution, without captured inputs.
bool backward_ready(const CeArgs& a, Dev dev) {
  const at::Tensor grad = at::empty(a.loss_sizes(), a.self.options().dtype(a.loss_type()));
  const at::Tensor lse = at::empty(a.lse_sizes(), a.self.options().dtype(at::kFloat));
  Call c(OpId::kCrossEntropyBackward, dev, grad);
  if (!c.active()) return false;
  c.t("grad", grad);
  a.bind(c);
  c.t("lse", lse);
  a.bind_scalars(c);
  return c.ready(/*capture=*/false);
}

at::Tensor cross_entropy_kernel(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                int64_t reduction, c10::SymInt ignore_index, double label_smoothing) {
  static const at::Tensor undefined;
  const at::Tensor& w = weight.has_value() ? *weight : undefined;
  auto own = [&] { return composite(self, target, weight, reduction, ignore_index, label_smoothing); };
  if (ignore_index.is_heap_allocated() || !eligible(self, target, w)) return own();   // symbolic: tracing
  const Dev dev = self.is_cuda() ? Dev::kCuda : Dev::kCpu;
  const bool upcast = dev == Dev::kCuda && self.scalar_type() != at::kFloat && at::autocast::is_autocast_enabled(at::kCUDA);
  const CeArgs a{self, target, w, reduction, ignore_index.expect_int(), label_smoothing, upcast};
  const bool grad = c10::GradMode::is_enabled() && self.requires_grad();
  auto bwd = [&] { return !grad || backward_ready(a, dev); };
  Call c(OpId::kCrossEntropy, dev, self);
  if (!c.active()) return own();
  a.bind(c);
  a.bind_scalars(c);
  auto eager = [&]() -> std::tuple<at::Tensor, at::Tensor> {
    at::Tensor loss = own();
    if (!c.compares()) return {loss, at::empty(a.lse_sizes(), self.options().dtype(at::kFloat))};
    c10::NoGradGuard no_grad;
    // PyTorch's own logsumexp, not kernelcraft's interception of it: this is the check's eager.
    return {loss, at::compositeexplicitautograd::logsumexp(self.to(at::kFloat), {-1})};
  };
  return serve_forward(c, bwd, grad, own, eager,
                       [&](at::Tensor loss, const at::Tensor& lse) { return attach_node(a, std::move(loss), lse); });
}

}  // namespace

void register_cross_entropy() {
  impl_above_autograd("cross_entropy_loss", TORCH_FN(cross_entropy_kernel), __FILE__, __LINE__);
}

}  // namespace kc::dispatch
