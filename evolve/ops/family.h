// One home per op family (the torch-free half): how a call of the family is made from a shape and
// what it outputs. The torch half (references, inputs, error model) is ops/reference.h. A family's
// two halves sit side by side in this folder: <family>.cpp and <family>_reference.cpp.
#pragma once
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// Dense contiguous metadata with a 16-byte aligned start, and an absent optional tensor.
TensorMeta dense_meta(const std::string& name, std::vector<int64_t> sizes, DType dt);
TensorMeta absent_meta(const std::string& name);
// A normalization's per-row statistics' sizes (mean, rstd): the leading sizes of `sizes`, then 1
// for each of the `normalized` trailing dims, as eager's layer_norm and rms_norm return them.
std::vector<int64_t> stat_sizes(const std::vector<int64_t>& sizes, size_t normalized);

struct FamilySchema {
  // The call's inputs (schema order) and scalars from the lead tensor's sizes and dtype and JSON
  // overrides (make_call); other inputs get the shapes the op needs. Outputs are inferred after.
  Status (*make)(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c);
  // The outputs eager produces for contiguous inputs (undefined entries for masked-out grads);
  // c has inputs and scalars.
  Result<std::vector<TensorMeta>> (*outputs)(const OpCall& c);
};

// The schema of `f` (every family in runtime/ops.def has one: OpSpec tests check it).
const FamilySchema& family_schema(OpFamily f);

}  // namespace kc::evolve
