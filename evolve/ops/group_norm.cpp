// Group norm forward, schema half: input (N, C, *) normalized over each of `group` groups of C /
// group channels and all of *, with optional per-channel affine parameters; the statistics
// (N, group) are in the parameters' dtype when those are fp32 and the input is reduced precision.
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status make_group_norm(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.size() < 2) return Status::error(Code::kInvalid, "group_norm needs (N, C, ...)");
  const int64_t N = sizes[0], C = sizes[1];
  int64_t hw = 1;
  for (size_t i = 2; i < sizes.size(); ++i) hw *= sizes[i];
  const int64_t group = args.value("group", std::min<int64_t>(32, C));
  if (group <= 0 || C % group != 0) return Status::error(Code::kInvalid, "group must divide C");
  const DType pdt = args.contains("param_dtype") ? dtype_from_name(args["param_dtype"].get<std::string>()).value_or(dt) : dt;
  const bool affine = args.value("affine", true);
  c.inputs = {dense_meta("input", sizes, dt), affine ? dense_meta("weight", {C}, pdt) : absent_meta("weight"),
              affine ? dense_meta("bias", {C}, pdt) : absent_meta("bias")};
  c.scalars = {{"N", N}, {"C", C}, {"HxW", hw}, {"group", group}, {"eps", args.value("eps", 1e-5)}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> group_norm_outputs(const OpCall& c) {
  const TensorMeta& x = c.inputs[0];
  const int64_t N = c.int_arg("N", 0), C = c.int_arg("C", 0), hw = c.int_arg("HxW", 0), group = c.int_arg("group", 0);
  if (group <= 0 || N * C * hw != x.numel() || C % group != 0) return Status::error(Code::kInvalid, "N, C, HxW, group");
  // Eager keeps fp32 statistics for a reduced-precision input with fp32 parameters (mixed type).
  const TensorMeta& w = c.inputs[1];
  const bool mixed = x.dtype != DType::kF32 && x.dtype != DType::kF64 && w.defined && w.dtype == DType::kF32;
  const DType sdt = mixed ? DType::kF32 : x.dtype;
  return std::vector<TensorMeta>{dense_meta("out0", x.sizes, x.dtype), dense_meta("out1", {N, group}, sdt),
                                 dense_meta("out2", {N, group}, sdt)};
}

}  // namespace

extern const FamilySchema kGroupNormSchema{&make_group_norm, &group_norm_outputs};

}  // namespace kc::evolve
