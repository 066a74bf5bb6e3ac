// Layer norm forward and backward, schema half: a reduction over the trailing normalized_shape,
// with optional affine parameters and fp32 (fp64 for fp64 inputs) saved statistics.
#include "evolve/ops/family.h"

#include <algorithm>

namespace kc::evolve {
namespace {

DType stat_dtype(DType dt) { return dt == DType::kF64 ? DType::kF64 : DType::kF32; }

// The statistics' sizes: the leading sizes, then 1 for each normalized dim.
std::vector<int64_t> stat_sizes(const std::vector<int64_t>& sizes, size_t normalized) {
  std::vector<int64_t> stat(sizes.begin(), sizes.end() - static_cast<long>(normalized));
  stat.resize(sizes.size(), 1);
  return stat;
}

Status make_layer_norm(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.empty()) return Status::error(Code::kInvalid, "layer_norm needs at least one dimension");
  std::vector<int64_t> ns = args.contains("normalized_shape") ? args["normalized_shape"].get<std::vector<int64_t>>()
                                                              : std::vector<int64_t>{sizes.back()};
  if (ns.empty() || ns.size() > sizes.size() ||
      !std::equal(ns.begin(), ns.end(), sizes.end() - static_cast<long>(ns.size())))
    return Status::error(Code::kInvalid, "normalized_shape must be the trailing sizes");
  const bool affine = args.value("affine", true);
  TensorMeta w = affine ? dense_meta("weight", ns, dt) : absent_meta("weight");
  TensorMeta b = affine && args.value("bias", true) ? dense_meta("bias", ns, dt) : absent_meta("bias");
  if (op == OpId::kLayerNorm) {
    c.inputs = {dense_meta("input", sizes, dt), w, b};
    c.scalars = {{"normalized_shape", ns}, {"eps", args.value("eps", 1e-5)}};
    return Status::ok();
  }
  const auto stat = stat_sizes(sizes, ns.size());
  c.inputs = {dense_meta("grad_out", sizes, dt), dense_meta("input", sizes, dt),
              dense_meta("mean", stat, stat_dtype(dt)), dense_meta("rstd", stat, stat_dtype(dt)), w, b};
  std::vector<int64_t> mask = args.contains("output_mask") ? args["output_mask"].get<std::vector<int64_t>>()
                                                           : std::vector<int64_t>{1, affine, affine};
  c.scalars = {{"normalized_shape", ns}, {"output_mask", mask}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> layer_norm_outputs(const OpCall& c) {
  const TensorMeta& lead = c.inputs[0];
  auto ns = c.list_arg("normalized_shape");
  if (ns.empty() || ns.size() > lead.sizes.size()) return Status::error(Code::kInvalid, "normalized_shape");
  const auto stat = stat_sizes(lead.sizes, ns.size());
  return std::vector<TensorMeta>{dense_meta("out0", lead.sizes, lead.dtype), dense_meta("out1", stat, stat_dtype(lead.dtype)),
                                 dense_meta("out2", stat, stat_dtype(lead.dtype))};
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
