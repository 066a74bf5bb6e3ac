// Embedding backward (embedding_dense_backward), schema half. Inputs in schema order: grad_output
// (indices' sizes + [D]) and indices (int64, or int32 with {"index_dtype": "i32"}: both accepted
// by ATen, checked on torch 2.13 CPU); scalars num_weights (default: as many rows as indices, so
// a plain call repeats some), padding_idx (-1: none; compared with the index values as they are,
// so another negative value never matches either) and scale_grad_by_freq. Output: [num_weights,
// D] in grad_output's dtype. ATen reads grad_output as [numel(indices), D] whatever its other
// sizes; the outputs check that product (the row count must match).
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }

Status make_embedding_backward(OpId, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.empty()) return invalid("embedding_backward needs grad_output [*indices, D]");
  const std::vector<int64_t> isz(sizes.begin(), sizes.end() - 1);
  int64_t n = 1;
  for (int64_t s : isz) n *= s;
  const DType idt = args.contains("index_dtype") ? dtype_from_name(args["index_dtype"].get<std::string>()).value_or(DType::kI64)
                                                 : DType::kI64;
  if (idt != DType::kI64 && idt != DType::kI32) return invalid("embedding indices are int64 or int32");
  c.inputs = {dense_meta("grad_output", sizes, dt), dense_meta("indices", isz, idt)};
  c.scalars = {{"num_weights", args.value("num_weights", std::max<int64_t>(n, 1))},
               {"padding_idx", args.value("padding_idx", int64_t{-1})},
               {"scale_grad_by_freq", args.value("scale_grad_by_freq", false)}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> embedding_backward_outputs(const OpCall& c) {
  const TensorMeta *g = c.input("grad_output"), *ix = c.input("indices");
  if (!g || !ix || !g->defined || !ix->defined || g->sizes.empty()) return invalid("embedding_backward takes grad_output and indices");
  if (ix->dtype != DType::kI64 && ix->dtype != DType::kI32) return invalid("embedding indices are int64 or int32");
  const int64_t D = g->sizes.back(), W = c.int_arg("num_weights", -1);
  if (W < 0) return invalid("num_weights must be non-negative");
  if (g->numel() != ix->numel() * D) return invalid("grad_output must hold numel(indices) rows of D");
  return std::vector<TensorMeta>{dense_meta("out0", {W, D}, g->dtype)};
}

}  // namespace

extern const FamilySchema kEmbeddingBackwardSchema{&make_embedding_backward, &embedding_backward_outputs};

}  // namespace kc::evolve
