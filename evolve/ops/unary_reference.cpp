// Unary and unary-backward families, torch half: eager references and inputs. Elementwise: no
// reduction model, and non-finite inputs ("special") have a defined answer.
#include "evolve/ops/reference.h"

namespace kc::evolve {
namespace {

const std::vector<std::string> kElementwiseKinds = {"normal", "large", "offset", "extreme", "special"};

std::vector<at::Tensor> unary_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  switch (c.op) {
    case OpId::kRelu: return {at::relu(in[0])};
    case OpId::kGelu: return {at::gelu(in[0], c.string_arg("approximate", "none"))};
    case OpId::kSilu: return {at::silu(in[0])};
    case OpId::kSigmoid: return {at::sigmoid(in[0])};
    case OpId::kTanh: return {at::tanh(in[0])};
    default: return {};
  }
}

at::Scalar threshold_of(const OpCall& c) {
  const ScalarArg* s = c.scalar("threshold");
  if (s && std::holds_alternative<double>(s->value)) return at::Scalar(std::get<double>(s->value));
  return at::Scalar(c.int_arg("threshold", 0));
}

std::vector<at::Tensor> unary_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  switch (c.op) {
    case OpId::kReluBackward: return {at::threshold_backward(in[0], in[1], threshold_of(c))};
    case OpId::kGeluBackward: return {at::gelu_backward(in[0], in[1], c.string_arg("approximate", "none"))};
    case OpId::kSiluBackward: return {at::silu_backward(in[0], in[1])};
    case OpId::kSigmoidBackward: return {at::sigmoid_backward(in[0], in[1])};
    case OpId::kTanhBackward: return {at::tanh_backward(in[0], in[1])};
    default: return {};
  }
}

// sigmoid and tanh backward receive the forward's output: computed from the drawn input.
void unary_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device dev) {
  if (c.op != OpId::kSigmoidBackward && c.op != OpId::kTanhBackward) return;
  at::Tensor y = c.op == OpId::kSigmoidBackward ? at::sigmoid(in[1]) : at::tanh(in[1]);
  at::Tensor out = empty_like_meta(c.inputs[1], dev);
  out.copy_(y);
  in[1] = out;
}

}  // namespace

extern const FamilyReference kUnaryReference{&unary_eager, &kElementwiseKinds, 1e3, 3.0, nullptr,
                                             nullptr, nullptr, nullptr, false};
extern const FamilyReference kUnaryBackwardReference{&unary_backward_eager, &kElementwiseKinds, 1e3, 3.0,
                                                     &unary_backward_derive, nullptr, nullptr, nullptr, false};

}  // namespace kc::evolve
