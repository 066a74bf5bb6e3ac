// Group norm backward (native_group_norm_backward), schema half. Inputs in schema order:
// grad_out, input (N, C, *), mean, rstd, weight; scalars N, C, HxW, group, output_mask. A call is
// made as autograd makes it from the forward's outputs (group_norm.cpp): mean and rstd are
// (N, group), in the input's dtype, or fp32 for a reduced-precision input with fp32 parameters
// (mixed type). ATen's native_group_norm is one function for CPU and CUDA, so the rule is the
// same on both (checked on torch 2.13 CPU; CUDA's GroupNormBackwardKernelImplInternal reads
// mean, rstd and gamma as the input's type, so CUDA eager only takes the unmixed call).
// Outputs (torch 2.13 CPU, checked by calling the op): grad_input in the input's dtype,
// grad_weight and grad_bias [C] in the weight's dtype, undefined where the mask is false. Eager
// refuses grad_weight / grad_bias without a weight ("tensor does not have a device"), so such a
// call has no outputs here either.
#include "evolve/ops/family.h"
#include "evolve/ops/group_norm.h"

namespace kc::evolve {
namespace {

bool reduced(DType d) { return d == DType::kBF16 || d == DType::kF16; }

Status make_group_norm_backward(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  auto gr = group_norm_shape("group_norm_backward", sizes, dt, args);
  if (!gr.is_ok()) return gr.status();
  const GroupNormShape& g = gr.value();
  const int64_t N = g.n, C = g.c, hw = g.hw, group = g.group;
  const DType pdt = g.param;
  const bool affine = g.affine;
  const DType sdt = reduced(dt) && affine && pdt == DType::kF32 ? DType::kF32 : dt;   // as the forward saved them
  c.inputs = {dense_meta("grad_out", sizes, dt), dense_meta("input", sizes, dt), dense_meta("mean", {N, group}, sdt),
              dense_meta("rstd", {N, group}, sdt), affine ? dense_meta("weight", {C}, pdt) : absent_meta("weight")};
  std::vector<int64_t> mask = args.contains("output_mask") ? args["output_mask"].get<std::vector<int64_t>>()
                                                           : std::vector<int64_t>{1, affine, affine};
  c.scalars = {{"N", N}, {"C", C}, {"HxW", hw}, {"group", group}, {"output_mask", mask}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> group_norm_backward_outputs(const OpCall& c) {
  auto mask = c.list_arg("output_mask");
  if (mask.size() != 3 || c.inputs.size() != 5) return Status::error(Code::kInvalid, "group_norm_backward takes 5 tensors");
  const TensorMeta& x = c.inputs[1];
  const int64_t N = c.int_arg("N", 0), C = c.int_arg("C", 0), hw = c.int_arg("HxW", 0), group = c.int_arg("group", 0);
  if (group <= 0 || C % group != 0 || N * C * hw != x.numel()) return Status::error(Code::kInvalid, "N, C, HxW, group");
  const TensorMeta& w = c.inputs[4];
  if ((mask[1] || mask[2]) && !w.defined)
    return Status::error(Code::kInvalid, "grad_weight / grad_bias need a weight (eager refuses the call)");
  std::vector<TensorMeta> out;
  out.push_back(mask[0] ? dense_meta("out0", x.sizes, x.dtype) : absent_meta("out0"));
  out.push_back(mask[1] ? dense_meta("out1", {C}, w.dtype) : absent_meta("out1"));
  out.push_back(mask[2] ? dense_meta("out2", {C}, w.dtype) : absent_meta("out2"));
  return out;
}

}  // namespace

extern const FamilySchema kGroupNormBackwardSchema{&make_group_norm_backward, &group_norm_backward_outputs};

}  // namespace kc::evolve
