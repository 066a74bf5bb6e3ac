// Layer norm forward and backward, schema half: a reduction over the trailing normalized_shape,
// with optional affine parameters. The saved statistics (mean, rstd: the forward's out1/out2, the
// backward's inputs) differ by backend (ATen's layer_norm_cuda vs layer_norm_cpu, checked on torch
// 2.13 CPU and in layer_norm_kernel.cu):
//   CUDA: the accumulate type (fp32 for f32/bf16/f16, fp64 for fp64); weight and bias must have
//         the input's dtype (eager reads them as the input's scalar type and refuses fp32 ones
//         with a bf16/f16 input), so a mixed call is refused here;
//   CPU:  fp32 when the input is reduced precision and a parameter is fp32 (mixed), else the
//         input's dtype (bf16 statistics for an all-bf16 call).
// The output has the input's dtype and grad_weight / grad_bias their parameter's, on both.
#include "evolve/ops/family.h"

#include <algorithm>

namespace kc::evolve {
namespace {

bool reduced(DType d) { return d == DType::kBF16 || d == DType::kF16; }

DType stat_dtype(BackendKind backend, DType dt, const TensorMeta& w, const TensorMeta& b) {
  if (backend == BackendKind::kCuda) return dt == DType::kF64 ? DType::kF64 : DType::kF32;
  const bool mixed = reduced(dt) && ((w.defined && w.dtype == DType::kF32) || (b.defined && b.dtype == DType::kF32));
  return mixed ? DType::kF32 : dt;
}

// Parameters in the input's dtype unless {"param_dtype": "f32"} (mixed precision, CPU only).
Status make_layer_norm(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.empty()) return Status::error(Code::kInvalid, "layer_norm needs at least one dimension");
  std::vector<int64_t> ns = args.contains("normalized_shape") ? args["normalized_shape"].get<std::vector<int64_t>>()
                                                              : std::vector<int64_t>{sizes.back()};
  if (ns.empty() || ns.size() > sizes.size() ||
      !std::equal(ns.begin(), ns.end(), sizes.end() - static_cast<long>(ns.size())))
    return Status::error(Code::kInvalid, "normalized_shape must be the trailing sizes");
  const DType pdt = args.contains("param_dtype") ? dtype_from_name(args["param_dtype"].get<std::string>()).value_or(dt) : dt;
  const bool affine = args.value("affine", true);
  TensorMeta w = affine ? dense_meta("weight", ns, pdt) : absent_meta("weight");
  TensorMeta b = affine && args.value("bias", true) ? dense_meta("bias", ns, pdt) : absent_meta("bias");
  if (c.backend == BackendKind::kCuda && affine && pdt != dt)
    return Status::error(Code::kInvalid, "CUDA's layer norm takes weight and bias in the input's dtype");
  if (op == OpId::kLayerNorm) {
    c.inputs = {dense_meta("input", sizes, dt), w, b};
    c.scalars = {{"normalized_shape", ns}, {"eps", args.value("eps", 1e-5)}};
    return Status::ok();
  }
  const auto stat = stat_sizes(sizes, ns.size());
  const DType sdt = stat_dtype(c.backend, dt, w, b);
  c.inputs = {dense_meta("grad_out", sizes, dt), dense_meta("input", sizes, dt),
              dense_meta("mean", stat, sdt), dense_meta("rstd", stat, sdt), w, b};
  std::vector<int64_t> mask = args.contains("output_mask") ? args["output_mask"].get<std::vector<int64_t>>()
                                                           : std::vector<int64_t>{1, affine, affine};
  c.scalars = {{"normalized_shape", ns}, {"output_mask", mask}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> layer_norm_outputs(const OpCall& c) {
  if (c.inputs.size() != 3) return Status::error(Code::kInvalid, "layer_norm takes 3 tensors");
  const TensorMeta& lead = c.inputs[0];
  auto ns = c.list_arg("normalized_shape");
  if (ns.empty() || ns.size() > lead.sizes.size()) return Status::error(Code::kInvalid, "normalized_shape");
  const auto stat = stat_sizes(lead.sizes, ns.size());
  const DType sdt = stat_dtype(c.backend, lead.dtype, c.inputs[1], c.inputs[2]);
  return std::vector<TensorMeta>{dense_meta("out0", lead.sizes, lead.dtype), dense_meta("out1", stat, sdt),
                                 dense_meta("out2", stat, sdt)};
}

Result<std::vector<TensorMeta>> layer_norm_backward_outputs(const OpCall& c) {
  auto mask = c.list_arg("output_mask");
  if (mask.size() != 3 || c.inputs.size() < 6) return Status::error(Code::kInvalid, "output_mask");
  const TensorMeta& input = c.inputs[1];
  const TensorMeta& weight = c.inputs[4];
  const TensorMeta& bias = c.inputs[5];
  std::vector<TensorMeta> out;
  out.push_back(mask[0] ? dense_meta("out0", input.sizes, input.dtype) : absent_meta("out0"));
  out.push_back(mask[1] && weight.defined ? dense_meta("out1", weight.sizes, weight.dtype) : absent_meta("out1"));
  out.push_back(mask[2] && bias.defined ? dense_meta("out2", bias.sizes, bias.dtype) : absent_meta("out2"));
  return out;
}

}  // namespace

extern const FamilySchema kLayerNormSchema{&make_layer_norm, &layer_norm_outputs};
extern const FamilySchema kLayerNormBackwardSchema{&make_layer_norm, &layer_norm_backward_outputs};

}  // namespace kc::evolve
