// The operators kernelcraft knows how to intercept: names, families and defaults (no torch here).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kc {

enum class OpId : int {
  kRelu, kGelu, kSilu, kSigmoid, kTanh, kSoftmax, kLogSoftmax, kLayerNorm,
  kReluBackward, kGeluBackward, kSiluBackward, kSigmoidBackward, kTanhBackward,
  kSoftmaxBackward, kLogSoftmaxBackward, kLayerNormBackward,
  kCount
};
constexpr int kNumOps = static_cast<int>(OpId::kCount);

enum class OpFamily { kUnary, kUnaryBackward, kSoftmax, kSoftmaxBackward, kLayerNorm, kLayerNormBackward };

struct OpInfo {
  OpId id;
  const char* name;      // short name used in config and the CLI, e.g. "relu", "relu_backward"
  const char* aten;      // the dispatcher operator it intercepts, e.g. "aten::threshold_backward"
  OpFamily family;
  bool default_on;       // part of the default interception list
};

const OpInfo& op_info(OpId id);
const std::vector<OpInfo>& all_ops();
// Accepts the short name ("gelu") or the aten name ("aten::gelu"); nullopt if unknown.
std::optional<OpId> op_by_name(std::string_view name);
const char* family_name(OpFamily f);

}  // namespace kc
