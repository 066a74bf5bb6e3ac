// Batch norm forward (native_batch_norm), schema half: input (N, C, *) normalized per channel over
// N and *, with optional per-channel affine parameters and running statistics. The saved
// statistics differ by backend (ATen's batch_norm_cuda vs batch_norm_cpu, checked on torch 2.11
// CUDA and 2.13 CPU):
//   CUDA: [C] in the accumulate type (fp32 for f32/bf16/f16, fp64 for fp64), in training and in
//         eval (eval: save_mean = running_mean, save_invstd = 1 / sqrt(running_var + eps));
//   CPU:  fp32 when the input is reduced precision and a parameter is fp32 (mixed), else the
//         input's dtype; [C] in training, [0] in eval.
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

bool reduced(DType d) { return d == DType::kBF16 || d == DType::kF16; }

Status make_batch_norm(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.size() < 2) return Status::error(Code::kInvalid, "batch_norm needs (N, C, ...)");
  const int64_t C = sizes[1];
  // Parameters in the input's dtype unless {"param_dtype": "f32"} (mixed precision).
  const DType pdt = args.contains("param_dtype") ? dtype_from_name(args["param_dtype"].get<std::string>()).value_or(dt) : dt;
  const bool affine = args.value("affine", true), running = args.value("running", true);
  auto param = [&](const char* n, bool on) { return on ? dense_meta(n, {C}, pdt) : absent_meta(n); };
  c.inputs = {dense_meta("input", sizes, dt), param("weight", affine), param("bias", affine),
              param("running_mean", running), param("running_var", running)};
  c.scalars = {{"training", args.value("training", true)}, {"momentum", args.value("momentum", 0.1)},
               {"eps", args.value("eps", 1e-5)}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> batch_norm_outputs(const OpCall& c) {
  if (c.inputs.size() != 5) return Status::error(Code::kInvalid, "batch_norm takes 5 tensors");
  const TensorMeta& x = c.inputs[0];
  if (x.sizes.size() < 2) return Status::error(Code::kInvalid, "batch_norm needs (N, C, ...)");
  const int64_t C = x.sizes[1];
  const bool training = c.int_arg("training", 1) != 0;
  DType sdt = x.dtype;
  std::vector<int64_t> ssz = {C};
  if (c.backend == BackendKind::kCuda) {
    sdt = x.dtype == DType::kF64 ? DType::kF64 : DType::kF32;
  } else {
    for (size_t k = 1; k < 5; ++k)
      if (reduced(x.dtype) && c.inputs[k].defined && c.inputs[k].dtype == DType::kF32) sdt = DType::kF32;
    if (!training) ssz = {0};
  }
  return std::vector<TensorMeta>{dense_meta("out0", x.sizes, x.dtype), dense_meta("out1", ssz, sdt),
                                 dense_meta("out2", ssz, sdt)};
}

}  // namespace

extern const FamilySchema kBatchNormSchema{&make_batch_norm, &batch_norm_outputs};

}  // namespace kc::evolve
