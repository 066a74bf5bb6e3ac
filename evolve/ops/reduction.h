// Reductions (sum, mean, amax, amin, argmax, argmin, var, std, var_mean, std_mean,
// linalg_vector_norm), torch-free geometry shared by the schema (reduction.cpp), the references
// and the templates: which dims a call reduces, with ATen's dim checks, and the lead input as
// [outer, r, inner] when the reduced dims are one block of adjacent dims.
#pragma once
#include <cstdint>
#include <vector>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// What a reduction computes per output element; one kind per op, plus the vector norm's order.
enum class ReduceKind : uint8_t { kSum, kMean, kMax, kMin, kArgMax, kArgMin, kVar, kStd, kVarMean, kStdMean, kNorm };
ReduceKind reduce_kind(OpId op);

// The norm's order: p = ord for 0 < ord < inf; max |x| for +inf, min |x| for -inf.
enum class NormOrd : uint8_t { kP, kInf, kNegInf };

struct ReduceGeom {
  ReduceKind kind = ReduceKind::kSum;
  std::vector<bool> reduced;        // per dim of the lead input (all, for a rank-0 input's one "dim")
  std::vector<int64_t> out_sizes;   // eager's output sizes (keepdim or not)
  bool block = false;               // the reduced dims of size > 1 are adjacent: outer/r/inner hold
  int64_t outer = 1, r = 1, inner = 1;
  double correction = 1;            // var / std: the divisor is max(r - correction, 0)
  NormOrd ord = NormOrd::kP;        // vector norm
  double p = 2;
};

// The geometry of a reduction call, or kInvalid where ATen rejects the call (a dim out of range
// or repeated, argmax / amax of an empty reduction, a norm order of 0 or below is kUnsupported).
Result<ReduceGeom> reduce_geometry(const OpCall& c);

}  // namespace kc::evolve
