// What the cross-entropy templates (cuda.cross_entropy[_backward], cpu.cross_entropy[_backward])
// need of a call beyond its geometry (evolve/ops/cross_entropy.h): the element type of every
// tensor they touch, and the checks all four share. Internal to evolve/propose.
#pragma once
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "evolve/ops/cross_entropy.h"
#include "evolve/propose/proposer.h"

namespace kc::evolve {

struct CeCall {
  CrossEntropyGeom g;
  DType x = DType::kF32;      // self (and grad_self)
  DType w = DType::kF32;      // weight, when present: self's dtype or fp32
  DType q = DType::kF32;      // probability target, when g.probs: self's dtype or fp32
  DType loss = DType::kF32;   // forward: out0; backward: grad (the loss's dtype)
  // Rows launch as a grid dimension and a row's vectors count in int.
  static constexpr int64_t kMaxRows = INT_MAX, kMaxClasses = INT_MAX / 2;
};

// True when `c` is a dense call of `family` on `backend` whose outputs are the schema's (the
// forward's loss and lse, the backward's grad_self) and whose grad has the loss's dtype.
inline bool ce_call(const OpCall& c, BackendKind backend, OpFamily family, CeCall& f) {
  if (c.backend != backend || op_info(c.op).family != family || !c.dense()) return false;
  auto g = cross_entropy_geometry(c);
  if (!g.is_ok()) return false;
  f.g = g.value();
  if (f.g.rows <= 0 || f.g.rows > CeCall::kMaxRows || f.g.classes <= 0 || f.g.classes > CeCall::kMaxClasses) return false;
  f.x = f.g.dt;
  if (f.g.weighted) f.w = c.input("weight")->dtype;
  if (f.g.probs) f.q = c.input("target")->dtype;
  if (f.g.backward) {
    f.loss = c.input("grad")->dtype;
    if (f.loss != f.g.loss_dtype() || c.outputs.size() != 1) return false;
    const TensorMeta& o = c.outputs[0];
    return o.defined && o.dtype == f.x && o.sizes == c.input("self")->sizes;
  }
  f.loss = f.g.loss_dtype();
  if (c.outputs.size() != 2 || !c.outputs[0].defined || !c.outputs[1].defined) return false;
  return c.outputs[0].dtype == f.loss && c.outputs[1].dtype == DType::kF32;
}

// The dtypes the CPU templates take: f32 and bf16 (no 16-bit float type to convert f16 there).
inline bool ce_cpu_dtypes(const CeCall& f) {
  for (DType d : {f.x, f.w, f.q, f.loss})
    if (d != DType::kF32 && d != DType::kBF16) return false;
  return true;
}

// The launch-spec expressions of the row count and the class count (self [N, C] or [C]).
inline const char* ce_rows_expr() { return "numel(self) / size(self, -1)"; }
inline const char* ce_classes_expr() { return "size(self, -1)"; }

// Shared by the CUDA forward and backward templates (templates_cuda_cross_entropy.cpp): the
// source before the kernels (types, flags, row geometry, loaders); the knob space, long rows capped
// at `cap` threads with `long_unroll` loads in flight; the registers a thread's loads take.
namespace cuda_tpl {
struct RowGeom;
}
std::string ce_cuda_prelude(const CeCall& f, const cuda_tpl::RowGeom& r, int64_t unroll);
std::vector<KnobDim> ce_cuda_space(const CeCall& f, int64_t cap, int64_t long_unroll);
int64_t ce_cuda_words(const CeCall& f, int64_t unroll, int64_t vec);

}  // namespace kc::evolve
