// Reductions (sum, mean, amax, amin, argmax, argmin, var, std, var_mean, std_mean,
// linalg_vector_norm, max.dim, min.dim, prod.dim_int, logsumexp), torch-free geometry shared by the schema (reduction.cpp), the references
// and the templates: which dims a call reduces, with ATen's dim checks, and the lead input as
// [outer, r, inner] when the reduced dims are one block of adjacent dims, or [r1, mid, r2] when
// they are two blocks around the kept ones.
#pragma once
#include <cstdint>
#include <vector>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// What a reduction computes per output element; one kind per op, plus the vector norm's order.
// kMaxDim / kMinDim: max.dim / min.dim, the value and its index in one pass; kProd: a product;
// kLogSumExp: log(sum(exp(x))), folded online as a running max and the sum of exp(x - max).
enum class ReduceKind : uint8_t {
  kSum, kMean, kMax, kMin, kArgMax, kArgMin, kVar, kStd, kVarMean, kStdMean, kNorm, kMaxDim, kMinDim, kProd, kLogSumExp
};
ReduceKind reduce_kind(OpId op);

// Kinds that keep the index of the value they select (argmax / argmin, max.dim / min.dim).
inline bool indexed(ReduceKind k) {
  return k == ReduceKind::kArgMax || k == ReduceKind::kArgMin || k == ReduceKind::kMaxDim || k == ReduceKind::kMinDim;
}
// Kinds whose best value is the largest (ties: the lowest index; NaN beats every number).
inline bool selects_max(ReduceKind k) {
  return k == ReduceKind::kMax || k == ReduceKind::kArgMax || k == ReduceKind::kMaxDim;
}
// Kinds that fold a Welford state (count, mean, squared deviations).
inline bool welford(ReduceKind k) {
  return k == ReduceKind::kVar || k == ReduceKind::kStd || k == ReduceKind::kVarMean || k == ReduceKind::kStdMean;
}

// The norm's order: p = ord for 0 < ord < inf; max |x| for +inf, min |x| for -inf.
enum class NormOrd : uint8_t { kP, kInf, kNegInf };

struct ReduceGeom {
  ReduceKind kind = ReduceKind::kSum;
  std::vector<bool> reduced;        // per dim of the lead input (all, for a rank-0 input's one "dim")
  std::vector<int64_t> out_sizes;   // eager's output sizes (keepdim or not)
  bool block = false;               // the reduced dims of size > 1 are adjacent: outer/r/inner hold
  int64_t outer = 1, r = 1, inner = 1;
  // Otherwise, the dims of size > 1 may be [r1 reduced][mid kept][r2 reduced] (batch-norm
  // statistics: dims (0, 2, 3) of NCHW): two_runs, and r = r1 * r2.
  bool two_runs = false;
  int64_t r1 = 1, mid = 1, r2 = 1;
  double correction = 1;            // var / std: the divisor is max(r - correction, 0)
  NormOrd ord = NormOrd::kP;        // vector norm
  double p = 2;
};

// The geometry of a reduction call, or kInvalid where ATen rejects the call (a dim out of range
// or repeated, argmax / amax / max.dim of an empty reduction; prod of one is 1), a norm order of 0
// or below is kUnsupported, and so is logsumexp over an empty dim list (eager reduces every dim
// then, and refuses it without keepdim).
Result<ReduceGeom> reduce_geometry(const OpCall& c);

}  // namespace kc::evolve
