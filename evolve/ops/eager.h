// The reference side of verification: the eager aten op for a call, fp64 twins, and fresh inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// Runs the aten operator of `c` on `inputs` (schema order, undefined tensors for absent ones) and
// returns its outputs as a list of c.outputs.size() entries (undefined for masked-out grads).
std::vector<at::Tensor> run_eager(const OpCall& c, const std::vector<at::Tensor>& inputs);

// One call of what the user's eager of `c` costs, for timing (FamilyReference::timed); outputs
// dropped.
void run_eager_timed(const OpCall& c, const std::vector<at::Tensor>& inputs);

// The same with every floating input promoted to float64 (the "exact" reference); outputs f64.
std::vector<at::Tensor> run_fp64(const OpCall& c, const std::vector<at::Tensor>& inputs);

// Input value families used by the gauntlet.
//   normal   N(0,1)                 large    N(0,1) * 1e3 (softmax: * 1e4)
//   offset   N(3,1) (layer norm: N(100,1))   extreme  denormals, huge and tiny values, +-0
//   special  normal plus a sprinkling of inf and nan (elementwise ops only)
// Kinds apply to floating inputs; integer inputs (class indices) are uniform integers whatever the
// kind, which the family's derive maps into its op's domain.
const std::vector<std::string>& input_kinds(OpId op);

// Fresh inputs with the call's exact metadata (sizes, strides, dtype) on `dev`. Inputs that an op
// receives from its forward (saved outputs, mean/rstd) are computed by the forward so they are
// consistent, as they are in training.
std::vector<at::Tensor> make_inputs(const OpCall& c, const std::string& kind, uint64_t seed, at::Device dev);

at::ScalarType to_scalar_type(DType d);
// An empty tensor with `m`'s sizes and strides (undefined if !m.defined) whose data pointer has
// exactly m.align's alignment class and no more (runtime/tensor_meta.h kAlignSpan): inputs and
// outputs of the gauntlet, so a kernel that assumes more alignment than its key is caught.
at::Tensor empty_like_meta(const TensorMeta& m, at::Device dev);

}  // namespace kc::evolve
