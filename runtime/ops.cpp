// The operator table: one row per intercepted aten operator. Backward ops are operators in their own
// right (autograd calls them), so they are intercepted like forward ones.
#include "runtime/ops.h"

namespace kc {

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> ops = {
      {OpId::kRelu, "relu", "aten::relu", OpFamily::kUnary, true},
      {OpId::kGelu, "gelu", "aten::gelu", OpFamily::kUnary, true},
      {OpId::kSilu, "silu", "aten::silu", OpFamily::kUnary, true},
      {OpId::kSigmoid, "sigmoid", "aten::sigmoid", OpFamily::kUnary, true},
      {OpId::kTanh, "tanh", "aten::tanh", OpFamily::kUnary, true},
      {OpId::kSoftmax, "softmax", "aten::_softmax", OpFamily::kSoftmax, true},
      {OpId::kLogSoftmax, "log_softmax", "aten::_log_softmax", OpFamily::kSoftmax, true},
      {OpId::kLayerNorm, "layer_norm", "aten::native_layer_norm", OpFamily::kLayerNorm, true},
      {OpId::kReluBackward, "relu_backward", "aten::threshold_backward", OpFamily::kUnaryBackward, true},
      {OpId::kGeluBackward, "gelu_backward", "aten::gelu_backward", OpFamily::kUnaryBackward, true},
      {OpId::kSiluBackward, "silu_backward", "aten::silu_backward", OpFamily::kUnaryBackward, true},
      {OpId::kSigmoidBackward, "sigmoid_backward", "aten::sigmoid_backward", OpFamily::kUnaryBackward, true},
      {OpId::kTanhBackward, "tanh_backward", "aten::tanh_backward", OpFamily::kUnaryBackward, true},
      {OpId::kSoftmaxBackward, "softmax_backward", "aten::_softmax_backward_data", OpFamily::kSoftmaxBackward, true},
      {OpId::kLogSoftmaxBackward, "log_softmax_backward", "aten::_log_softmax_backward_data",
       OpFamily::kSoftmaxBackward, true},
      {OpId::kLayerNormBackward, "layer_norm_backward", "aten::native_layer_norm_backward",
       OpFamily::kLayerNormBackward, true},
  };
  return ops;
}

const OpInfo& op_info(OpId id) { return all_ops()[static_cast<int>(id)]; }

std::optional<OpId> op_by_name(std::string_view name) {
  for (const auto& o : all_ops())
    if (name == o.name || name == o.aten) return o.id;
  return std::nullopt;
}

const char* family_name(OpFamily f) {
  switch (f) {
    case OpFamily::kUnary: return "unary";
    case OpFamily::kUnaryBackward: return "unary_backward";
    case OpFamily::kSoftmax: return "softmax";
    case OpFamily::kSoftmaxBackward: return "softmax_backward";
    case OpFamily::kLayerNorm: return "layer_norm";
    case OpFamily::kLayerNormBackward: return "layer_norm_backward";
  }
  return "?";
}

}  // namespace kc
