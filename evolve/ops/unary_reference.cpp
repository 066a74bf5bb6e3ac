// Unary and unary-backward families, torch half: eager references and inputs. Elementwise: no
// reduction model, and non-finite inputs ("special") have a defined answer.
#include "evolve/ops/reference.h"

namespace kc::evolve {
namespace {

const std::vector<std::string> kElementwiseKinds = {"normal", "large", "offset", "extreme", "special"};

// A scalar argument as the caller passed it (an int stays an int: eager's type promotion sees it).
at::Scalar scalar_of(const OpCall& c, const char* name, double dflt) {
  const ScalarArg* s = c.scalar(name);
  if (s && std::holds_alternative<int64_t>(s->value)) return at::Scalar(std::get<int64_t>(s->value));
  return at::Scalar(c.double_arg(name, dflt));
}

std::vector<at::Tensor> unary_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto S = [&](const char* n, double d) { return scalar_of(c, n, d); };
  switch (c.op) {
    case OpId::kRelu: return {at::relu(in[0])};
    case OpId::kGelu: return {at::gelu(in[0], c.string_arg("approximate", "none"))};
    case OpId::kSilu: return {at::silu(in[0])};
    case OpId::kSigmoid: return {at::sigmoid(in[0])};
    case OpId::kTanh: return {at::tanh(in[0])};
    case OpId::kLeakyRelu: return {at::leaky_relu(in[0], S("negative_slope", 0.01))};
    case OpId::kElu: return {at::elu(in[0], S("alpha", 1), S("scale", 1), S("input_scale", 1))};
    case OpId::kHardtanh: return {at::hardtanh(in[0], S("min_val", -1), S("max_val", 1))};
    case OpId::kHardsigmoid: return {at::hardsigmoid(in[0])};
    case OpId::kHardswish: return {at::hardswish(in[0])};
    case OpId::kSoftplus: return {at::softplus(in[0], S("beta", 1), S("threshold", 20))};
    case OpId::kMish: return {at::mish(in[0])};
    default: return {};
  }
}

std::vector<at::Tensor> unary_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto S = [&](const char* n, double d) { return scalar_of(c, n, d); };
  const at::Tensor &g = in[0], &x = in[1];
  switch (c.op) {
    case OpId::kReluBackward: return {at::threshold_backward(g, x, S("threshold", 0))};
    case OpId::kGeluBackward: return {at::gelu_backward(g, x, c.string_arg("approximate", "none"))};
    case OpId::kSiluBackward: return {at::silu_backward(g, x)};
    case OpId::kSigmoidBackward: return {at::sigmoid_backward(g, x)};
    case OpId::kTanhBackward: return {at::tanh_backward(g, x)};
    case OpId::kLeakyReluBackward:
      return {at::leaky_relu_backward(g, x, S("negative_slope", 0.01), c.int_arg("self_is_result", 0) != 0)};
    case OpId::kEluBackward:
      return {at::elu_backward(g, S("alpha", 1), S("scale", 1), S("input_scale", 1), c.int_arg("is_result", 0) != 0, x)};
    case OpId::kHardtanhBackward: return {at::hardtanh_backward(g, x, S("min_val", -1), S("max_val", 1))};
    case OpId::kHardsigmoidBackward: return {at::hardsigmoid_backward(g, x)};
    case OpId::kHardswishBackward: return {at::hardswish_backward(g, x)};
    case OpId::kSoftplusBackward: return {at::softplus_backward(g, x, S("beta", 1), S("threshold", 20))};
    case OpId::kMishBackward: return {at::mish_backward(g, x)};
    default: return {};
  }
}

// Backward ops that receive the forward's output get it computed from the drawn input.
void unary_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device dev) {
  auto S = [&](const char* n, double d) { return scalar_of(c, n, d); };
  at::Tensor y;
  if (c.op == OpId::kSigmoidBackward) y = at::sigmoid(in[1]);
  else if (c.op == OpId::kTanhBackward) y = at::tanh(in[1]);
  else if (c.op == OpId::kEluBackward && c.int_arg("is_result", 0))
    y = at::elu(in[1], S("alpha", 1), S("scale", 1), S("input_scale", 1));
  else if (c.op == OpId::kLeakyReluBackward && c.int_arg("self_is_result", 0))
    y = at::leaky_relu(in[1], S("negative_slope", 0.01));
  else
    return;
  at::Tensor out = empty_like_meta(c.inputs[1], dev);
  out.copy_(y);
  in[1] = out;
}

}  // namespace

extern const FamilyReference kUnaryReference{&unary_eager, &kElementwiseKinds, 1e3, 3.0, nullptr,
                                             nullptr, nullptr, nullptr, false, nullptr};
extern const FamilyReference kUnaryBackwardReference{&unary_backward_eager, &kElementwiseKinds, 1e3, 3.0,
                                                     &unary_backward_derive, nullptr, nullptr, nullptr, false, nullptr};

}  // namespace kc::evolve
