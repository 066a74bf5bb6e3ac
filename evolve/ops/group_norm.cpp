// Group norm forward, schema half: input (N, C, *) normalized over each of `group` groups of C /
// group channels and all of *, with optional per-channel affine parameters; the statistics
// (N, group) are in the parameters' dtype when those are fp32 and the input is reduced precision.
#include "evolve/ops/family.h"
#include "evolve/ops/group_norm.h"

namespace kc::evolve {
namespace {

Status make_group_norm(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  auto gr = group_norm_shape("group_norm", sizes, dt, args);
  if (!gr.is_ok()) return gr.status();
  const GroupNormShape& g = gr.value();
  const int64_t N = g.n, C = g.c, hw = g.hw, group = g.group;
  c.inputs = {dense_meta("input", sizes, dt), g.affine ? dense_meta("weight", {C}, g.param) : absent_meta("weight"),
              g.affine ? dense_meta("bias", {C}, g.param) : absent_meta("bias")};
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
