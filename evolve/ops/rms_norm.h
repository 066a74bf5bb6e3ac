// Fused RMSNorm (kernelcraft's own pair of operators, caught above autograd from aten::rms_norm:
// dispatcher/rms_norm.cpp), torch-free geometry shared by the schema (rms_norm.cpp), the
// references and the templates.
//
// Forward kernelcraft::rms_norm(input, weight?; normalized_shape, eps) -> (out, rstd):
//   input [..., *normalized_shape] in f32, bf16 or f16, contiguous; weight normalized_shape in
//   input's dtype, or absent. With R = the product of the leading sizes (rows) and K = the
//   product of normalized_shape (cols), per row x:
//     rstd = 1 / sqrt(sum_j x_j^2 / K + eps)      (fp32, accumulated in fp32)
//     out_j = x_j * rstd * w_j                     (fp32 arithmetic, rounded once to input's dtype)
//   rstd: fp32, the leading sizes then a 1 per normalized dim (layer norm's statistics' shape): the
//   one statistic the backward needs. out: input's sizes and dtype. eps is always concrete: the
//   dispatcher resolves eager's None to fp32's machine epsilon (eager's opmath epsilon for these
//   dtypes). Under CUDA autocast eager's policy for rms_norm is fp32 (autocast casts the input
//   before this operator is reached), so no autocast flag is part of the key.
//
// Backward kernelcraft::rms_norm_backward(grad, input, rstd, weight?; normalized_shape, eps,
// output_mask) -> (grad_input, grad_weight):
//   grad: out's sizes and dtype; rstd: the forward's. output_mask [2]: which of the two outputs are
//   wanted (grad_weight only with a weight). With a_j = grad_j w_j and xhat_j = x_j rstd (fp32):
//     grad_input_j  = rstd (a_j - xhat_j * sum_k a_k xhat_k / K)     (input's dtype)
//     grad_weight_j = sum over rows of grad_j xhat_j                  (weight's dtype, fp32 sums)
//   eps is unused by a kernel (rstd carries it); it is in the key because eager's backward
//   recomputes the forward. These are eager's formulas (the composite's autograd), not an
//   approximation of them.
#pragma once
#include <cstdint>
#include <vector>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

struct RmsNormGeom {
  int64_t rows = 1, cols = 1;
  std::vector<int64_t> stat_sizes;   // rstd's sizes
  bool weighted = false;
  bool want_input = true, want_weight = false;   // backward: output_mask, weight's only with a weight
  double eps = 1e-6;
  DType dt = DType::kF32;   // input's (and out's, grad's, weight's)
  bool backward = false;
};

// The geometry of a forward or backward call, or kInvalid where eager's checks (or this pair's
// scope: a weight in another dtype) reject it; nothing is served for a refused call.
Result<RmsNormGeom> rms_norm_geometry(const OpCall& c);

}  // namespace kc::evolve
