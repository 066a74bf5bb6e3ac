// Unary and unary-backward families, schema half: elementwise ops of one tensor (and its gradient).
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status make_unary(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt)};
  if (op == OpId::kGelu) c.scalars = {{"approximate", args.value("approximate", std::string("none"))}};
  return Status::ok();
}

Status make_unary_backward(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args,
                           OpCall& c) {
  // sigmoid and tanh backward take the forward's output, the others its input.
  const bool from_output = op == OpId::kSigmoidBackward || op == OpId::kTanhBackward;
  c.inputs = {dense_meta("grad_output", sizes, dt), dense_meta(from_output ? "output" : "self", sizes, dt)};
  if (op == OpId::kGeluBackward) c.scalars = {{"approximate", args.value("approximate", std::string("none"))}};
  if (op == OpId::kReluBackward) {
    if (args.contains("threshold") && args["threshold"].is_number_float())
      c.scalars = {{"threshold", args["threshold"].get<double>()}};
    else
      c.scalars = {{"threshold", args.value("threshold", int64_t{0})}};
  }
  return Status::ok();
}

Result<std::vector<TensorMeta>> same_as_lead(const OpCall& c) {
  return std::vector<TensorMeta>{dense_meta("out0", c.inputs[0].sizes, c.inputs[0].dtype)};
}

}  // namespace

extern const FamilySchema kUnarySchema{&make_unary, &same_as_lead};
extern const FamilySchema kUnaryBackwardSchema{&make_unary_backward, &same_as_lead};

}  // namespace kc::evolve
