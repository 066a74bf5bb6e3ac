// Softmax and log_softmax, forward and backward, schema half: a reduction over one axis, `dim`.
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status make_softmax(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt)};
  c.scalars = {{"dim", args.value("dim", int64_t{-1})}, {"half_to_float", false}};
  return Status::ok();
}

Status make_softmax_backward(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args,
                             OpCall& c) {
  c.inputs = {dense_meta("grad_output", sizes, dt), dense_meta("output", sizes, dt)};
  c.scalars = {{"dim", args.value("dim", int64_t{-1})}, {"input_dtype", std::string(dtype_name(dt))}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> softmax_outputs(const OpCall& c) {
  if (c.int_arg("half_to_float", 0)) return Status::error(Code::kUnsupported, "half_to_float");
  return std::vector<TensorMeta>{dense_meta("out0", c.inputs[0].sizes, c.inputs[0].dtype)};
}

}  // namespace

extern const FamilySchema kSoftmaxSchema{&make_softmax, &softmax_outputs};
extern const FamilySchema kSoftmaxBackwardSchema{&make_softmax_backward, &softmax_outputs};

}  // namespace kc::evolve
