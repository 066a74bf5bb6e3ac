// The fold states of the CUDA reduction template (templates_cuda_reduction.cpp): one per
// reduction kind, the device code every one of its kernels folds through (S, kc_init, kc_add,
// kc_merge, kc_shfl, kc_store, and optionally kc_add_n / kc_warp). Internal to evolve/.
#pragma once
#include <cstdint>
#include <string>

#include "evolve/ops/reduction.h"

namespace kc::evolve::cuda_tpl {

// The device code of g's fold state; `exp2`: logsumexp's exp as exp2f(x log2 e) (its knob).
std::string reduction_fold_state(const ReduceGeom& g, bool exp2);
// The kernels' device code after the state: rows, split, finish and columns; `two_runs` adds the
// two-run kernel (templates_cuda_reduction_kernels.cpp).
std::string reduction_kernels(bool two_runs);
// Bytes of one fold state (the column merge's shared memory and the split's scratch).
int64_t reduction_state_bytes(ReduceKind k);

}  // namespace kc::evolve::cuda_tpl
