// Losses (mse_loss, smooth_l1_loss, huber_loss, binary_cross_entropy,
// binary_cross_entropy_with_logits, nll_loss_forward, nll_loss2d_forward) and their backward ops
// (all but bce with logits'), torch-free geometry shared by the schema (loss.cpp), the references
// and the templates: what one term of the loss is, how many terms there are and how they reduce.
#pragma once
#include <cstdint>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// ATen's at::Reduction values: the `reduction` argument of every loss.
enum class LossReduction : int64_t { kNone = 0, kMean = 1, kSum = 2 };

// The kind of term: elementwise f(self, target) (regression, bce and bce with logits) or a
// class-index gather (nll). The values are rendered into template sources: append, never reorder.
enum class LossKind { kMse, kSmoothL1, kHuber, kBce, kNll, kBceLogits };

struct LossGeom {
  LossKind kind = LossKind::kMse;
  LossReduction reduction = LossReduction::kMean;
  int64_t terms = 0;          // elements (elementwise) or targets (nll)
  // nll: `terms` = rows * spatial targets, each picking self[(row, target, s)], classes apart
  // `spatial` elements; 1d nll (self [C], target []) is one row.
  int64_t classes = 1, spatial = 1;
  bool one_d = false;         // 1d nll: a scalar output even without reduction
  bool weighted = false;      // a weight tensor is present
  bool pos_weighted = false;  // bce with logits: a pos_weight tensor is present
  // bce with logits: weight and pos_weight broadcast against self. Where one is a suffix
  // broadcast (its sizes, leading 1s dropped, are self's trailing sizes: [C] or [1, C] against
  // [N, C], or self's own sizes), term i reads its element i % w_mod (resp. pw_mod), its numel;
  // 0 where absent, -1 for any other broadcast (kept eager's by the templates).
  int64_t w_mod = 0, pw_mod = 0;
  int64_t ignore_index = -100;
  double param = 1.0;         // smooth_l1's beta, huber's delta
  // The output is elementwise (one value per term) rather than one reduced scalar.
  bool elementwise() const { return reduction == LossReduction::kNone && !one_d; }
};

// The forward op of a loss backward (the op itself for a forward).
OpId loss_forward_of(OpId op);
LossKind loss_kind(OpId op);

// The geometry of a loss call (forward or backward: tensors by name), or kInvalid where ATen's shape checks reject it. Self and target
// of an elementwise loss must have the same sizes here (ATen broadcasts; those calls stay
// eager's, see the schema).
Result<LossGeom> loss_geometry(const OpCall& c);

}  // namespace kc::evolve
