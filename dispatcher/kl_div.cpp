// aten::kl_div (F.kl_div, nn.KLDivLoss) caught above autograd as one call (docs/DESIGN.md
// "Composites above autograd"). PyTorch runs it as a composite: xlogy, mul and sub (or exp, sub
// and mul with log_target), each writing a tensor of the input's size, then the reduction; in
// backward as many again. Here a served pair of kernelcraft operators (evolve/ops/kl_div.h) runs
// instead: a fused forward that reads self and target once, and a C++ autograd node that saves
// them (no intermediate) and whose backward writes the gradient of self in one pass.
//
// PyTorch's composite runs, bit for bit, whenever the call is not a plain eager one (see
// cross_entropy.cpp: subclasses, fake tensors, dispatch modes, forward AD), the target wants a
// gradient, self and target differ in shape or dtype (eager's broadcasting and promotion then
// apply), or the pair is not ready. kl_div is on CUDA autocast's fp32 list: autocast has cast both
// tensors when this kernel runs, so eager's and the pair's dtypes agree without a flag.
#include <ATen/ATen.h>
#include <ATen/ops/kl_div_compositeimplicitautograd_dispatch.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <optional>

#include "dispatcher/call.h"
#include "dispatcher/composite.h"

namespace kc::dispatch {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

struct KlArgs {
  const at::Tensor& self;
  const at::Tensor& target;
  int64_t reduction;
  bool log_target;

  void bind(Call& c) const {
    c.t("self", self);
    c.t("target", target);
    c.i("reduction", reduction);
    c.b("log_target", log_target);
  }
  void bind_backward(Call& c, const at::Tensor& grad) const {
    c.t("grad", grad);
    bind(c);
  }
  // The forward's output (and so the backward's grad): self's sizes, or 0-dim when reduced.
  at::Tensor placeholder_grad() const {
    return reduction == at::Reduction::None ? at::empty(self.sizes(), self.options()) : at::empty({}, self.options());
  }
};

at::Tensor composite(const KlArgs& a, const at::Tensor& self) {
  return at::compositeimplicitautograd::kl_div(self, a.target, a.reduction, a.log_target);
}

// The calls the pair takes: a plain eager call with self and target of one shape and dtype (f32,
// bf16 or f16), a target that wants no gradient and a reduction eager knows.
bool eligible(const at::Tensor& self, const at::Tensor& target, int64_t reduction) {
  if (!no_dispatch_mode() || !self.defined() || !target.defined()) return false;
  if (!plain_tensor(self, self) || !plain_tensor(target, self)) return false;
  const at::ScalarType s = self.scalar_type();
  if (s != at::kFloat && s != at::kBFloat16 && s != at::kHalf) return false;
  if (target.scalar_type() != s || target.sizes() != self.sizes() || self.numel() == 0) return false;
  return !target.requires_grad() && reduction >= 0 && reduction <= 2;
}

// Eager for the backward key: the composite's own autograd, run again from the saved tensors
// (only while the backward's kernel cannot answer).
at::Tensor eager_backward(const KlArgs& a, const at::Tensor& grad) {
  c10::AutoGradMode grad_on(true);
  const at::Tensor leaf = a.self.detach().requires_grad_(true);
  const at::Tensor out = composite(a, leaf);
  return torch::autograd::grad({out}, {leaf}, {grad})[0];
}

struct KlDivNode : torch::autograd::Node {
  SavedVariable self_, target_;
  int64_t reduction_ = at::Reduction::Mean;
  bool log_target_ = false;

  std::string name() const override { return "KernelcraftKlDivBackward"; }
  void release_variables() override {
    self_.reset_data();
    target_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {at::Tensor()};
    const at::Tensor self = self_.unpack(), target = target_.unpack();
    const KlArgs a{self, target, reduction_, log_target_};
    const at::Tensor grad = grads[0].to(self.scalar_type()).contiguous();
    Call c(OpId::kKlDivBackward, self.is_cuda() ? Dev::kCuda : Dev::kCpu, grad);
    if (c.active()) a.bind_backward(c, grad);
    return {c.run<at::Tensor>([&] { return eager_backward(a, grad); })};
  }
};

at::Tensor attach_node(const KlArgs& a, at::Tensor out) {
  KlDivNode* node = nullptr;
  const NodePtr owner = new_node(node);
  node->set_next_edges(torch::autograd::collect_next_edges(a.self));
  node->self_ = SavedVariable(a.self, false);
  node->target_ = SavedVariable(a.target, false);
  node->reduction_ = a.reduction;
  node->log_target_ = a.log_target;
  torch::autograd::set_history(out, owner);
  return out;
}

// Whether the backward key (grad as a placeholder of its metadata) is ready; a first miss
// requests its evolution, without captured inputs.
bool backward_ready(const KlArgs& a, Dev dev) {
  const at::Tensor grad = a.placeholder_grad();
  Call c(OpId::kKlDivBackward, dev, grad);
  if (!c.active()) return false;
  a.bind_backward(c, grad);
  return c.ready(/*capture=*/false);
}

// composite.h serve_forward's flow for a forward with one output and no statistic: the forward's
// key first (settled: the composite, and the backward's key is never built), then the backward's
// when a gradient will be needed; the kernel's output gets the node, the composite's keeps its graph.
at::Tensor kl_div_kernel(const at::Tensor& self, const at::Tensor& target, int64_t reduction, bool log_target) {
  const KlArgs a{self, target, reduction, log_target};
  auto own = [&] { return composite(a, self); };
  if (!eligible(self, target, reduction)) return own();
  const Dev dev = self.is_cuda() ? Dev::kCuda : Dev::kCpu;
  const bool grad = c10::GradMode::is_enabled() && self.requires_grad();
  Call c(OpId::kKlDiv, dev, self);
  if (!c.active()) return own();
  a.bind(c);
  const Call::Readiness fwd = c.readiness(/*capture=*/true);
  if (fwd == Call::Readiness::kSettled) return own();
  if ((grad && !backward_ready(a, dev)) || fwd != Call::Readiness::kReady) return own();
  std::optional<at::Tensor> eager_out;
  at::Tensor out = c.run<at::Tensor>([&] {
    eager_out = own();
    return *eager_out;
  });
  if (eager_out && out.is_same(*eager_out)) return out;   // PyTorch's own result and graph
  return grad ? attach_node(a, std::move(out)) : out;
}

}  // namespace

void register_kl_div() {
  impl_above_autograd("kl_div", TORCH_FN(kl_div_kernel), __FILE__, __LINE__);
}

}  // namespace kc::dispatch
