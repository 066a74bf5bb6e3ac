// Pooling (max_pool2d/3d_with_indices, avg_pool2d/3d), torch-free geometry shared by the schema
// (pool.cpp), the references and the templates: the window of every spatial axis with ATen's list
// broadcasting (one value for every axis, an empty stride = the kernel) and output-size rule.
#pragma once
#include <cstdint>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// Three spatial axes (t, h, w); 2d pooling has t = 1 with a 1-wide window. Sizes are ints, as
// ATen's kernels hold them.
struct PoolGeom {
  bool max = true;               // max pooling (values + int64 indices) or average pooling
  int nd = 2;                    // spatial dims: 2 or 3
  bool batched = true;           // (N, C, spatial) rather than (C, spatial)
  int64_t planes = 0;            // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, p[3] = {0, 0, 0}, d[3] = {1, 1, 1};
  bool ceil = false;
  bool count_include_pad = true;
  int64_t divisor = 0;           // divisor_override; 0: none
};

// The geometry of a pooling call, or kInvalid where ATen's shape check rejects it.
Result<PoolGeom> pool_geometry(const OpCall& c);

// ATen's pooling output size along one axis: floor (or ceil) of the padded extent over the
// stride, and in ceil mode never a last window that starts past the input and its left padding.
int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil);

}  // namespace kc::evolve
