// Pooling (max_pool2d/3d_with_indices, avg_pool2d/3d, _adaptive_avg_pool2d/3d, and kernelcraft's
// max_pool2d/3d_values: aten::max_pool2d/3d caught above autograd where no gradient is wanted, so
// the values alone, without the int64 indices that are 2/3 of a stride-1 pool's bytes; see
// dispatcher/max_pool.cpp) and its backward
// (the PoolBackward family), torch-free geometry shared by the schemas (pool.cpp,
// pool_backward.cpp), the references and the templates: the window of every spatial axis with
// ATen's list broadcasting (one value for every axis, an empty stride = the kernel) and
// output-size rule, or the adaptive windows [floor(o In / Out), ceil((o + 1) In / Out)).
#pragma once
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

enum class PoolKind { kMax, kAvg, kAdaptive };

// What a pooling operator is; nullopt for an operator of neither pooling family.
struct PoolOp {
  PoolKind kind = PoolKind::kMax;
  int nd = 2;              // spatial dims: 2 or 3
  bool backward = false;   // grad_input from grad_output (and indices for max)
  bool indices = true;     // max pooling writes int64 indices beside the values
};
std::optional<PoolOp> pool_op(OpId op);

// Three spatial axes (t, h, w); 2d pooling has t = 1 with a 1-wide window. Sizes are ints, as
// ATen's kernels hold them. For adaptive pooling k is the longest window of the axis (the error
// model's term count), s = d = 1 and p = 0.
struct PoolGeom {
  bool max = true;               // max pooling (values + int64 indices, or values alone: !indices)
  bool indices = true;           // max: the int64 indices are an output too
  bool adaptive = false;         // adaptive average pooling (else: windowed average when !max)
  bool backward = false;
  int nd = 2;                    // spatial dims: 2 or 3
  bool batched = true;           // (N, C, spatial) rather than (C, spatial)
  int64_t planes = 0;            // N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, p[3] = {0, 0, 0}, d[3] = {1, 1, 1};
  bool ceil = false;
  bool count_include_pad = true;
  int64_t divisor = 0;           // divisor_override; 0: none
  bool global() const { return adaptive && out[0] == 1 && out[1] == 1 && out[2] == 1; }
};

// The geometry of a pooling call (forward or backward: the forward's input is `self`), or
// kInvalid where ATen's shape check rejects it or grad_output / indices do not fit it.
Result<PoolGeom> pool_geometry(const OpCall& c);

// ATen's pooling output size along one axis: floor (or ceil) of the padded extent over the
// stride, and in ceil mode never a last window that starts past the input and its left padding.
int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil);

// The forward op of a PoolBackward op (max_pool2d_with_indices_backward -> max_pool2d, ...).
OpId pool_forward_of(OpId backward_op);

// Adaptive window o of `out` over `in` elements: [adaptive_start, adaptive_end).
inline int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return o * in / out; }
inline int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

// The outputs [lo, hi) along axis a whose window can hold input element i: for max pooling the
// dilated extent [o s - p, o s - p + (k - 1) d + 1) (the taps and the argmax lie inside it), for
// average pooling [o s - p, o s - p + k), for adaptive pooling the adaptive windows. A gather
// backward visits exactly these.
void pool_windows_of(const PoolGeom& g, int a, int64_t i, int64_t& lo, int64_t& hi);

// Channels-last layout of batched (N, C, spatial) tensors: C innermost, then W, H, T, N (torch's
// channels_last / channels_last_3d). is_channels_last: m is laid out so (sizes-1 dims aside) and is
// not also contiguous; channels_last_strided: the strides alone (a (N, C, 1, 1) tensor is both);
// to_channels_last gives m those strides.
std::vector<int64_t> channels_last_strides(const std::vector<int64_t>& sizes);
bool channels_last_strided(const TensorMeta& m);
bool is_channels_last(const TensorMeta& m);
void to_channels_last(TensorMeta& m);

// The scalar arguments of pooling op `op` in schema order, from JSON overrides (a 2-wide window,
// stride = kernel, no padding by default; adaptive: output_size, default all 1 = global).
Status pool_scalars(OpId op, const nlohmann::json& args, OpCall& c);

}  // namespace kc::evolve
