// KL divergence forward and backward, torch half: eager references (at::kl_div, the composite
// kernelcraft replaces, and its autograd), the targets the gauntlet draws (derived from the drawn
// values) and the error model: the forward over the whole call as the losses' (loss_reference.cpp:
// one condition magnitude per term, then elementwise or one reduced scalar), the backward
// elementwise on eager's evidence, as the losses' backward.
#include "evolve/ops/reference.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "evolve/ops/kl_div.h"

namespace kc::evolve {
namespace {

// No "special": a mean or sum over inf and nan is not an elementwise answer.
const std::vector<std::string> kKlKinds = {"normal", "large", "offset", "extreme"};

bool log_target(const OpCall& c) {
  auto g = kl_div_geometry(c);
  return g.is_ok() && g->log_target;
}

at::Tensor kl_forward(const OpCall& c, const std::vector<at::Tensor>& in) {
  return at::kl_div(in[0], in[1], c.int_arg("reduction", 1), log_target(c));
}

std::vector<at::Tensor> kl_eager(const OpCall& c, const std::vector<at::Tensor>& in) { return {kl_forward(c, in)}; }

// grad_self by eager's own autograd through the composite (the backward's tensors: grad, self,
// target; the forward is kl_forward on self and target).
std::vector<at::Tensor> kl_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  c10::AutoGradMode grad_on(true);
  const at::Tensor x = in[1].detach().requires_grad_(true);
  const at::Tensor out = kl_forward(c, {x, in[2]});
  return {torch::autograd::grad({out}, {x}, {in[0]})[0]};
}

// The user's backward alone: autograd of a graph built once per input set.
void kl_backward_timed(const OpCall& c, const std::vector<at::Tensor>& in) {
  backward_only({in[1], in[2]}, {true, false}, in[0], &kl_forward, c);
}

// Targets as KLDivLoss receives them, in place: probabilities (a sigmoid of the drawn values, one
// element in seven exactly 0, where xlogy's 0 * log 0 = 0 applies) or, with log_target,
// log-probabilities -|t| (exp of the large kind underflows to 0 rather than overflowing).
void kl_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  at::Tensor t = in[1].to(at::kFloat).contiguous();
  if (log_target(c)) {
    t.abs_().neg_();
  } else {
    t.sigmoid_();
    at::Tensor flat = t.view(-1);
    flat.slice(0, 0, flat.numel(), 7).zero_();
  }
  in[1].copy_(t);
}

void kl_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device dev) {
  std::vector<at::Tensor> fwd(in.begin() + 1, in.end());
  kl_derive(c, fwd, dev);   // in place: the same tensors
}

// Per term, in fp64: the value v and its condition magnitude h (in units of u), eager's formula
// formed from exact inputs:
//   v = t log t - t x: log t and its product round relative to themselves (2 |t log t|), t x once
//     (|t x|), the difference once (|v|); t == 0 is an exact 0;
//   v = exp(t) (t - x): exp, the difference and the product each round relative to v: 3 |v|.
struct KlTerms {
  at::Tensor value, h;
};
KlTerms kl_terms(const std::vector<at::Tensor>& in, bool log_t) {
  const at::Tensor x = f64(in[0]), t = f64(in[1]);
  if (log_t) {
    at::Tensor v = t.exp() * (t - x);
    return {v, v.abs() * 3};
  }
  const at::Tensor tlt = at::xlogy(t, t), tx = t * x;
  at::Tensor v = tlt - tx;
  return {v, tlt.abs() * 2 + tx.abs() + v.abs()};
}

// Output 0's condition magnitude, output-shaped: h per term without reduction; a sum of n fp32
// terms errs by about sqrt(n) ulp of sum |term| in any order, on top of each term's own rounding:
// g sum |v| + sum h + |y| (sum), the same over n (mean).
at::Tensor kl_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t) {
  auto gr = kl_div_geometry(c);
  if (!gr.is_ok()) return at::zeros(c.outputs[0].sizes, in[0].options().dtype(at::kDouble));
  const KlDivGeom& g = gr.value();
  const KlTerms tm = kl_terms(in, g.log_target);
  if (g.elementwise()) return tm.h.contiguous();
  const double gs = std::sqrt(static_cast<double>(std::max<int64_t>(g.terms, 1)));
  const at::Tensor V = tm.value.sum();
  at::Tensor E = tm.value.abs().sum().mul_(gs).add_(tm.h.sum());
  if (g.reduction != LossReduction::kMean) return E.add_(V.abs());
  const double n = static_cast<double>(std::max<int64_t>(g.terms, 1));
  return E.div_(n).add_((V / n).abs_());
}

// A reduction (so numerics treats it as one); the model itself is kl_whole.
RowLayout kl_layout(const OpCall&, const std::vector<at::Tensor>&, size_t) {
  RowLayout l;
  l.model = true;
  return l;
}
RowView kl_view(size_t) { return RowView::kWhole; }

}  // namespace

extern const FamilyReference kKlDivReference{&kl_eager, &kKlKinds, 1e3, 3.0, &kl_derive,
                                             &kl_layout, &kl_view, nullptr, false, &kl_whole};
extern const FamilyReference kKlDivBackwardReference{&kl_backward_eager, &kKlKinds, 1e3, 3.0, &kl_backward_derive,
                                                     nullptr, nullptr, nullptr, false, nullptr, &kl_backward_timed};

}  // namespace kc::evolve
