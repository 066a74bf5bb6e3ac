// KL divergence (kernelcraft's own pair of operators, caught above autograd from aten::kl_div:
// dispatcher/kl_div.cpp), torch-free geometry shared by the schema (kl_div.cpp), the references
// and the templates.
//
// Forward kernelcraft::kl_div(self, target; reduction, log_target) -> out:
//   self (log-probabilities) and target of one shape and dtype (f32, bf16 or f16), contiguous.
//   Per element, as ATen's Loss.cpp forms it:
//     log_target false: xlogy(t, t) - t * x    (0 where t == 0, NaN where t is NaN or < 0)
//     log_target true:  exp(t) * (t - x)
//   reduction 0 (none): out has self's sizes and dtype; 1 (mean: the sum / numel) or 2 (sum): a
//   0-dim tensor in self's dtype. Terms are computed and summed in fp32, rounded once.
//   F.kl_div's 'batchmean' reaches aten as sum (Python divides by size(0)). Under CUDA autocast
//   kl_div is on autocast's fp32 list, so the pair sees fp32 tensors and needs no flag.
//
// Backward kernelcraft::kl_div_backward(grad, self, target; reduction, log_target) -> grad_self:
//   grad: out's sizes and dtype (one value for mean and sum). Per element, the composite's
//   autograd: -t * g (log_target false) or -exp(t) * g (true), g = grad (none), grad (sum) or
//   grad / numel (mean); self's sizes and dtype. self is read for its metadata only.
#pragma once
#include <cstdint>

#include "evolve/ops/loss.h"
#include "evolve/ops/op_call.h"

namespace kc::evolve {

struct KlDivGeom {
  int64_t terms = 0;   // elements of self (and target)
  LossReduction reduction = LossReduction::kMean;
  bool log_target = false;
  DType dt = DType::kF32;
  bool backward = false;
  bool elementwise() const { return reduction == LossReduction::kNone; }
};

// The geometry of a forward or backward call, or kInvalid where eager's checks or this pair's
// scope (self and target of one shape and dtype: a broadcast stays PyTorch's) reject it.
Result<KlDivGeom> kl_div_geometry(const OpCall& c);

}  // namespace kc::evolve
