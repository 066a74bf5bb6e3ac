// What group norm's forward and backward calls share in their schemas (group_norm.cpp,
// group_norm_backward.cpp): the (N, C, HxW) view of the input, the group count, the parameters'
// dtype and whether they exist.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"
#include "runtime/tensor_meta.h"

namespace kc::evolve {

struct GroupNormShape {
  int64_t n = 0, c = 0, hw = 1, group = 0;
  DType param = DType::kF32;   // the weight's and bias's dtype ("param_dtype", else the input's)
  bool affine = true;
};

// From the lead tensor's sizes and the call's JSON arguments; kInvalid unless (N, C, ...) with a
// group count that divides C. `op` names the operator in the message.
inline Result<GroupNormShape> group_norm_shape(const char* op, const std::vector<int64_t>& sizes, DType dt,
                                               const nlohmann::json& args) {
  if (sizes.size() < 2) return Status::error(Code::kInvalid, std::string(op) + " needs (N, C, ...)");
  GroupNormShape g;
  g.n = sizes[0];
  g.c = sizes[1];
  for (size_t i = 2; i < sizes.size(); ++i) g.hw *= sizes[i];
  g.group = args.value("group", std::min<int64_t>(32, g.c));
  if (g.group <= 0 || g.c % g.group != 0) return Status::error(Code::kInvalid, "group must divide C");
  g.param = args.contains("param_dtype") ? dtype_from_name(args["param_dtype"].get<std::string>()).value_or(dt) : dt;
  g.affine = args.value("affine", true);
  return g;
}

}  // namespace kc::evolve
