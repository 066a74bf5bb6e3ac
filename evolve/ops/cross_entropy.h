// Fused cross-entropy (kernelcraft's own pair of operators, caught above autograd from
// aten::cross_entropy_loss: dispatcher/cross_entropy.cpp), torch-free geometry shared by the
// schema (cross_entropy.cpp), the references and the templates.
//
// Forward kernelcraft::cross_entropy(self, target, weight?; reduction, ignore_index,
// label_smoothing, upcast) -> (loss, lse):
//   self [N, C] (or [C]: one row) in f32, bf16 or f16; target int64 class indices [N] ([]) or
//   class probabilities of self's sizes; weight [C]. Probabilities and weight are in self's dtype,
//   or in fp32 with `upcast` (autocast's mixed dtypes). lse: log-sum-exp of each row in fp32, [N]
//   ([] for one row): the one statistic the backward needs, so no log-probability tensor is kept.
//   loss: [N] for reduction none (a batched input), else 0-dim; self's dtype, fp32 with `upcast`
//   (eager under CUDA autocast: nll_loss is in its fp32 list).
// Per row i, with x = self[i], lse = log sum_j exp(x_j), e = label_smoothing, W = sum_j weight_j
// (C without weight), w_j = weight_j (1 without weight):
//   class target t:  term = (1 - e) w_t (lse - x_t) + (e / C) (lse W - sum_j w_j x_j)
//                    (0 where t == ignore_index; NaN where t is neither that nor a class);
//   probabilities p: q_j = (1 - e) p_j + e / C, term = sum_j w_j q_j (lse - x_j).
//   none: loss[i] = term; sum: sum_i term; mean: sum_i term / D, D = sum over rows not ignored of
//   w_t (class targets; 0 / 0 = NaN when every row is ignored) or D = N (probabilities).
// These are eager's formulas (at::cross_entropy_loss), not an approximation of them.
//
// Backward kernelcraft::cross_entropy_backward(grad, self, target, weight?, lse; same scalars) ->
// grad_self (self's sizes and dtype): grad is the loss's gradient (the loss's shape and dtype), lse
// the forward's. With P_j = exp(x_j - lse) and s = grad[i] (none), grad (sum), grad / D (mean):
//   class target t:  grad_self[i, j] = s ((1 - e) w_t (P_j - [j == t]) + (e / C) (W P_j - w_j)),
//                    0 on ignored rows;
//   probabilities:   grad_self[i, j] = s (P_j sum_k w_k q_k - w_j q_j).
#pragma once
#include <cstdint>

#include "evolve/ops/loss.h"
#include "evolve/ops/op_call.h"

namespace kc::evolve {

struct CrossEntropyGeom {
  int64_t rows = 1, classes = 0;
  bool one_d = false;      // self [C]: one row, 0-dim outputs whatever the reduction
  bool probs = false;      // target holds class probabilities (else int64 class indices)
  bool weighted = false;   // a weight tensor is present
  LossReduction reduction = LossReduction::kMean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  bool upcast = false;     // the call ran under CUDA autocast: eager's loss is fp32
  DType dt = DType::kF32;  // self's dtype
  bool backward = false;   // the call is the backward operator

  DType loss_dtype() const { return upcast ? DType::kF32 : dt; }
  // The loss is one value per row (reduction none on a batched input) rather than 0-dim.
  bool per_row() const { return reduction == LossReduction::kNone && !one_d; }
};

// The geometry of a forward or backward call (tensors by name), or kInvalid where eager's checks
// reject it (eager's own error then reaches the caller; nothing is served).
Result<CrossEntropyGeom> cross_entropy_geometry(const OpCall& c);

}  // namespace kc::evolve
