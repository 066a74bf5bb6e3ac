// The operators kernelcraft knows how to intercept: names, families and defaults (no torch here).
// The rows themselves are in runtime/ops.def.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kc {

enum class OpId : int {
#define KC_OP(id, name, fn, overload, family, on) k##id,
#define KC_COMPOSITE(id, name, op, family, on) k##id,
#include "runtime/ops.def"
#undef KC_COMPOSITE
#undef KC_OP
  kCount
};
constexpr int kNumOps = static_cast<int>(OpId::kCount);

enum class OpFamily {
#define KC_FAMILY(f, name) k##f,
#include "runtime/ops.def"
#undef KC_FAMILY
  kCount
};
constexpr int kNumFamilies = static_cast<int>(OpFamily::kCount);

struct OpInfo {
  OpId id;
  const char* name;      // short name used in config and the CLI, e.g. "relu", "relu_backward"
  const char* aten;      // the dispatcher operator it intercepts, e.g. "aten::threshold_backward"
  const char* overload;  // its overload name ("" for the default overload)
  OpFamily family;
  bool default_on;       // part of the default interception list
  // kernelcraft's own operator for a composite caught above autograd (ops.def KC_COMPOSITE): its
  // `aten` is a kernelcraft:: name, and it has no kernel at a backend key.
  bool composite = false;
};

const OpInfo& op_info(OpId id);
const std::vector<OpInfo>& all_ops();
// Accepts the short name ("gelu") or the aten name ("aten::gelu"); nullopt if unknown.
std::optional<OpId> op_by_name(std::string_view name);
const char* family_name(OpFamily f);

}  // namespace kc
