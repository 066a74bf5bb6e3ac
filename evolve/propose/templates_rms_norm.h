// What the RMSNorm templates (cuda.rms_norm[_backward], cpu.rms_norm[_backward]) need of a call
// beyond its geometry (evolve/ops/rms_norm.h): the checks all four share. Internal to
// evolve/propose.
#pragma once
#include <climits>
#include <cstdint>
#include <vector>

#include "evolve/ops/rms_norm.h"
#include "evolve/propose/proposer.h"

namespace kc::evolve {

struct RmsCall {
  RmsNormGeom g;
  // Rows launch as a grid dimension and a row's vectors count in int.
  static constexpr int64_t kMaxRows = INT_MAX, kMaxCols = INT_MAX / 2;
};

// True when `c` is a dense call of `family` on `backend` whose outputs are the schema's (the
// forward's out and fp32 rstd; the backward's grad_input and grad_weight as output_mask asks).
inline bool rms_call(const OpCall& c, BackendKind backend, OpFamily family, RmsCall& f) {
  if (c.backend != backend || op_info(c.op).family != family || !c.dense()) return false;
  auto g = rms_norm_geometry(c);
  if (!g.is_ok()) return false;
  f.g = g.value();
  if (f.g.rows <= 0 || f.g.rows > RmsCall::kMaxRows || f.g.cols <= 0 || f.g.cols > RmsCall::kMaxCols) return false;
  if (c.outputs.size() != 2) return false;
  const TensorMeta &o0 = c.outputs[0], &o1 = c.outputs[1];
  // Sizes too: a kernel writes rows x cols outputs and cols weight gradients.
  const std::vector<int64_t>& xs = c.input("input")->sizes;
  if (!f.g.backward)
    return o0.defined && o0.dtype == f.g.dt && o0.sizes == xs && o1.defined && o1.dtype == DType::kF32 &&
           o1.sizes == f.g.stat_sizes;
  return o0.defined == f.g.want_input && o1.defined == f.g.want_weight &&
         (!o0.defined || (o0.dtype == f.g.dt && o0.sizes == xs)) &&
         (!o1.defined || (o1.dtype == f.g.dt && o1.sizes == c.input("weight")->sizes));
}

// The dtypes the CPU templates take: f32 and bf16 (no 16-bit float type to convert f16 there).
inline bool rms_cpu_dtypes(const RmsCall& f) { return f.g.dt == DType::kF32 || f.g.dt == DType::kBF16; }

}  // namespace kc::evolve
