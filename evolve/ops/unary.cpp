// Unary and unary-backward families, schema half: elementwise ops of one tensor (and its gradient).
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

// An op's scalars in schema order with the defaults make_call uses (its Python defaults).
std::vector<std::pair<const char*, json>> unary_scalars(OpId op) {
  switch (op) {
    case OpId::kGelu:
    case OpId::kGeluBackward: return {{"approximate", "none"}};
    case OpId::kReluBackward: return {{"threshold", 0}};
    case OpId::kLeakyRelu: return {{"negative_slope", 0.01}};
    case OpId::kLeakyReluBackward: return {{"negative_slope", 0.01}, {"self_is_result", false}};
    case OpId::kElu: return {{"alpha", 1.0}, {"scale", 1}, {"input_scale", 1}};
    case OpId::kEluBackward: return {{"alpha", 1.0}, {"scale", 1}, {"input_scale", 1}, {"is_result", false}};
    case OpId::kHardtanh:
    case OpId::kHardtanhBackward: return {{"min_val", -1.0}, {"max_val", 1.0}};
    case OpId::kSoftplus:
    case OpId::kSoftplusBackward: return {{"beta", 1.0}, {"threshold", 20.0}};
    default: return {};
  }
}

ScalarArg scalar_from(const char* name, const json& v) {
  if (v.is_boolean()) return {name, v.get<bool>()};
  if (v.is_number_integer()) return {name, v.get<int64_t>()};
  if (v.is_number()) return {name, v.get<double>()};
  return {name, v.get<std::string>()};
}

std::vector<ScalarArg> scalars_of(OpId op, const json& args) {
  std::vector<ScalarArg> out;
  for (const auto& [name, dflt] : unary_scalars(op)) out.push_back(scalar_from(name, args.contains(name) ? args[name] : dflt));
  return out;
}

Status make_unary(OpId op, const std::vector<int64_t>& sizes, DType dt, const json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt)};
  c.scalars = scalars_of(op, args);
  return Status::ok();
}

// The name of a backward op's saved tensor: the forward's output, its input, or either.
const char* saved_name(OpId op) {
  switch (op) {
    case OpId::kSigmoidBackward:
    case OpId::kTanhBackward: return "output";
    case OpId::kEluBackward: return "self_or_result";
    default: return "self";
  }
}

Status make_unary_backward(OpId op, const std::vector<int64_t>& sizes, DType dt, const json& args, OpCall& c) {
  c.inputs = {dense_meta("grad_output", sizes, dt), dense_meta(saved_name(op), sizes, dt)};
  c.scalars = scalars_of(op, args);
  return Status::ok();
}

Result<std::vector<TensorMeta>> same_as_lead(const OpCall& c) {
  return std::vector<TensorMeta>{dense_meta("out0", c.inputs[0].sizes, c.inputs[0].dtype)};
}

}  // namespace

extern const FamilySchema kUnarySchema{&make_unary, &same_as_lead};
extern const FamilySchema kUnaryBackwardSchema{&make_unary_backward, &same_as_lead};

}  // namespace kc::evolve
