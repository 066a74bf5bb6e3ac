// Batch norm backward (native_batch_norm_backward), schema half. Inputs in schema order:
// grad_out, input (N, C, *), weight, running_mean, running_var, save_mean, save_invstd; scalars
// train, eps, output_mask. A call is made as autograd makes it from the forward's outputs
// (batch_norm.cpp): the saved statistics are [C] in the accumulate type on CUDA (in eval too,
// where they hold the running mean and 1 / sqrt(running_var + eps)); on the CPU they are the
// input's dtype (fp32 when mixed), [C] in training and [0] in eval. Training ignores the running
// statistics, eval reads them (checked on torch 2.13 CPU; ATen's batch_norm_backward_cuda).
// Outputs (torch 2.13 CPU, checked by calling the op; CUDA per batch_norm_backward_cuda_template):
// grad_input in the input's dtype; grad_weight and grad_bias [C] in the weight's dtype, undefined
// where the mask is false. Without a weight the CPU gives them in the saved statistics' dtype
// (training) or the running statistics' (eval); the CUDA answer there is taken to be the same
// and is not checked (no template serves that call).
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

bool reduced(DType d) { return d == DType::kBF16 || d == DType::kF16; }

Status make_batch_norm_backward(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.size() < 2) return Status::error(Code::kInvalid, "batch_norm_backward needs (N, C, ...)");
  const int64_t C = sizes[1];
  const DType pdt = args.contains("param_dtype") ? dtype_from_name(args["param_dtype"].get<std::string>()).value_or(dt) : dt;
  const bool train = args.value("train", true), affine = args.value("affine", true);
  // Running statistics: eval needs them; a training call has them when the module tracks them.
  const bool running = !train || args.value("running", false);
  DType sdt = pdt;   // the saved statistics' dtype
  if (c.backend == BackendKind::kCuda) sdt = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  else if (!(reduced(dt) && pdt == DType::kF32)) sdt = dt;
  const std::vector<int64_t> ssz = {c.backend == BackendKind::kCpu && !train ? 0 : C};
  auto param = [&](const char* n, bool on) { return on ? dense_meta(n, {C}, pdt) : absent_meta(n); };
  c.inputs = {dense_meta("grad_out", sizes, dt), dense_meta("input", sizes, dt), param("weight", affine),
              param("running_mean", running), param("running_var", running), dense_meta("save_mean", ssz, sdt),
              dense_meta("save_invstd", ssz, sdt)};
  std::vector<int64_t> mask = args.contains("output_mask") ? args["output_mask"].get<std::vector<int64_t>>()
                                                           : std::vector<int64_t>{1, affine, affine};
  c.scalars = {{"train", train}, {"eps", args.value("eps", 1e-5)}, {"output_mask", mask}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> batch_norm_backward_outputs(const OpCall& c) {
  auto mask = c.list_arg("output_mask");
  if (mask.size() != 3 || c.inputs.size() != 7) return Status::error(Code::kInvalid, "batch_norm_backward takes 7 tensors");
  const TensorMeta& x = c.inputs[1];
  if (x.sizes.size() < 2) return Status::error(Code::kInvalid, "batch_norm_backward needs (N, C, ...)");
  const TensorMeta& w = c.inputs[2];
  const TensorMeta& stat = c.int_arg("train", 1) != 0 ? c.inputs[5] : c.inputs[3];
  const DType pdt = w.defined ? w.dtype : stat.defined ? stat.dtype : x.dtype;
  const std::vector<int64_t> csz = {x.sizes[1]};
  std::vector<TensorMeta> out;
  out.push_back(mask[0] ? dense_meta("out0", x.sizes, x.dtype) : absent_meta("out0"));
  out.push_back(mask[1] ? dense_meta("out1", csz, pdt) : absent_meta("out1"));
  out.push_back(mask[2] ? dense_meta("out2", csz, pdt) : absent_meta("out2"));
  return out;
}

}  // namespace

extern const FamilySchema kBatchNormBackwardSchema{&make_batch_norm_backward, &batch_norm_backward_outputs};

}  // namespace kc::evolve
