// A plain, small call of every operator for the tests that loop over all of runtime/ops.def:
// the lead tensor's sizes and the JSON arguments make_call needs for it (layer norm's
// normalized shape, pooling's spatial dims, batch norm without running stats, since training
// with them updates its inputs, which no template does; nll_loss2d's (N, C, H, W); embedding
// backward's table size and padding row).
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/ops/pool.h"
#include "runtime/ops.h"

namespace kc::evolve {

struct PlainCall {
  std::vector<int64_t> sizes;
  nlohmann::json args = nlohmann::json::object();
};

// `rows` x `cols` where the family takes a matrix; the family's own rank elsewhere.
inline PlainCall plain_call(const OpInfo& info, int64_t rows, int64_t cols) {
  PlainCall p{{rows, cols}};
  switch (info.family) {
    case OpFamily::kLayerNorm:
    case OpFamily::kLayerNormBackward: p.args["normalized_shape"] = {cols}; break;
    case OpFamily::kBatchNorm: p.args["running"] = false; break;
    case OpFamily::kGroupNorm:
    case OpFamily::kGroupNormBackward: p.args["group"] = 2; p.sizes = {rows, 4, cols}; break;
    case OpFamily::kPool:
    case OpFamily::kPoolBackward:   // self's sizes; the backward's grad_output follows from them
      p.sizes = pool_op(info.id)->nd == 3 ? std::vector<int64_t>{2, 3, 4, 6, cols} : std::vector<int64_t>{2, 3, rows, cols};
      // Adaptive: a non-global output (a 1x1 grad_output is contiguous whatever its strides).
      if (pool_op(info.id)->kind == PoolKind::kAdaptive)
        p.args["output_size"] = pool_op(info.id)->nd == 3 ? std::vector<int64_t>{2, 3, 5} : std::vector<int64_t>{3, 5};
      break;
    case OpFamily::kLoss:   // self [rows, cols] (nll: rows targets of cols classes); nll2d's is 4d
    case OpFamily::kLossBackward:
      if (info.id == OpId::kNllLoss2d || info.id == OpId::kNllLoss2dBackward) p.sizes = {2, cols, 3, rows};
      break;
    case OpFamily::kEmbeddingBackward:   // grad_output [rows, cols] into a table of 2 x rows, row 1 padding
      p.args["num_weights"] = 2 * rows;
      p.args["padding_idx"] = 1;
      break;
    default: break;
  }
  return p;
}

}  // namespace kc::evolve
