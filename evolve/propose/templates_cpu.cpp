// CPU op-family templates: C++ sources for the CPU kernel ABI (runtime/cpu_backend.h, kc_cpu.h)
// plus their launch specs. fp32, contiguous (OpCall::dense()) calls only.
//
// Every source depends only on the op, which optional tensors are present and the code-shaping
// knobs (unroll, simd, acc, stats); shapes and work splits (elements or rows per block, row
// splitting, how weight/bias gradients are reduced) travel in the launch spec (block[0] hints
// and i64 arguments), so one compiled source serves every shape and split of a variant.
//
// Families and knobs (the first value of each knob is the default):
//   cpu.unary            relu gelu(none|tanh) silu sigmoid tanh
//                        elems (elements per block), unroll (1 2 4 8), simd (restrict + ivdep),
//                        vexp (exp-based ops: 0 libm expf, 1 an inline exp the compiler vectorizes)
//   cpu.unary_backward   threshold_backward gelu_backward silu_backward sigmoid_backward
//                        tanh_backward; same knobs
//   cpu.softmax          _softmax _log_softmax over the last dim: rows (rows per block),
//                        unroll (independent accumulator lanes), acc (1: double, 0: float with
//                        Kahan compensation), simd, vexp
//   cpu.softmax_backward _softmax_backward_data _log_softmax_backward_data; same knobs (vexp for
//                        the log variant only)
//   cpu.layer_norm       native_layer_norm: rows, split (0: one block per row range; else a row is
//                        cut into chunks of this many elements: partial moments into scratch,
//                        then a second launch combines them (Chan) and normalizes), stats
//                        (0: two-pass, 1: shifted one-pass in double), acc, unroll, simd
//   cpu.layer_norm_backward native_layer_norm_backward: rows, split (as above, for grad_input),
//                        wb_rows (0: weight/bias grads by a column-blocked launch; R: partial
//                        column sums over R-row slabs in scratch + a finishing launch),
//                        wb_cols (columns per block of those launches), acc, unroll, simd
//   cpu.group_norm       native_group_norm over (n, group) rows: rows, split (as layer norm),
//                        unroll, simd; moments two-pass in double (templates_cpu_group_norm.cpp)
//   cpu.batch_norm       native_batch_norm, per-channel over (N, HxW): training without running
//                        stats (chunk: channel slices of partial moments) or eval; unroll, simd
//                        (templates_cpu_batch_norm.cpp)
//   cpu.batch_norm_backward  native_batch_norm_backward: per-channel sums in double, then
//                        grad_input over planes; planes, unroll, simd (templates_cpu_batch_norm_backward.cpp)
//   cpu.group_norm_backward  native_group_norm_backward: per-plane sums in double, per (n, group)
//                        row coefficients, per-channel grads in order of n, then grad_input over
//                        planes; planes, unroll, simd (templates_cpu_group_norm_backward.cpp)
//   cpu.embedding_backward  embedding_dense_backward: a stable bucket list of positions per row,
//                        then each row summed in position order; rows, simd
//                        (templates_cpu_embedding_backward.cpp)
//   cpu.pool             pooling forward, adaptive included: rows, acc (templates_cpu_pool.cpp)
//   cpu.pool_backward    pooling backward as a gather over the windows holding each input
//                        element: rows, acc (templates_cpu_pool_backward.cpp)
//   cpu.loss             mse_loss smooth_l1_loss huber_loss binary_cross_entropy nll_loss(2d):
//                        elementwise, or block partial sums in a fixed order and a finishing
//                        launch (templates_cpu_loss.cpp)
//   cpu.loss_backward    mse_loss_backward binary_cross_entropy_backward nll_loss(2d)_backward:
//                        elementwise; nll writes each target's column once (templates_cpu_loss_backward.cpp)
//   cpu.cross_entropy    kernelcraft::cross_entropy (f32 / bf16): per row max, then exp sum and
//                        the loss's sums; per-row terms folded in row order by a finishing launch:
//                        rows, unroll, acc, vexp (templates_cpu_cross_entropy.cpp)
//   cpu.cross_entropy_backward  grad_self from the forward's lse, each element written once (D and
//                        W by a one-block launch first where needed): rows, vexp, simd
//                        (templates_cpu_cross_entropy_backward.cpp)
//   cpu.rms_norm         kernelcraft::rms_norm (f32 / bf16): per row sum of squares, rstd, out =
//                        x rstd w: rows, split (as layer norm: chunk sums in scratch, added in
//                        chunk order by every chunk), acc, unroll, simd (templates_cpu_rms_norm.cpp)
//   cpu.rms_norm_backward  grad_input and/or grad_weight from the forward's rstd: rows, split (as
//                        above), wb_rows, wb_cols (as layer norm's backward), fuse (both grads: the
//                        grad_input pass writes the slab partials), acc, unroll, simd
//                        (templates_cpu_rms_norm_backward.cpp)
//   cpu.kl_div           kernelcraft::kl_div: elementwise, or block partial sums in a fixed order
//                        and a finishing launch (cpu.loss's scheme): elems, simd / acc, unroll
//   cpu.kl_div_backward  -t g or -exp(t) g, elementwise: elems, simd (templates_cpu_kl_div.cpp)
// All reductions run in a fixed order, so results do not depend on how blocks are threaded.
//
// This file is the registry; the families live in
// templates_cpu_{unary,softmax,layer_norm,layer_norm_backward}.cpp and
// share templates_cpu_common.h.
#include "evolve/propose/proposer.h"

namespace kc::evolve {

const Template* cpu_unary_template(bool backward);
const Template* cpu_softmax_template(bool backward);
const Template* cpu_layer_norm_template();
const Template* cpu_layer_norm_backward_template();
const Template* cpu_group_norm_template();
const Template* cpu_batch_norm_template();
const Template* cpu_scan_template();
const Template* cpu_pool_template();
const Template* cpu_reduction_template();
const Template* cpu_pool_backward_template();
const Template* cpu_loss_template();
const Template* cpu_loss_backward_template();
const Template* cpu_batch_norm_backward_template();
const Template* cpu_group_norm_backward_template();
const Template* cpu_embedding_backward_template();
const Template* cpu_cross_entropy_template();
const Template* cpu_cross_entropy_backward_template();
const Template* cpu_rms_norm_template();
const Template* cpu_rms_norm_backward_template();
const Template* cpu_kl_div_template();
const Template* cpu_kl_div_backward_template();

const std::vector<const Template*>& cpu_templates() {
  static const std::vector<const Template*> v = {cpu_unary_template(false),     cpu_unary_template(true),
                                                 cpu_softmax_template(false),   cpu_softmax_template(true),
                                                 cpu_layer_norm_template(), cpu_layer_norm_backward_template(), cpu_scan_template(),
                                                 cpu_group_norm_template(), cpu_batch_norm_template(), cpu_pool_template(), cpu_reduction_template(),
                                                 cpu_pool_backward_template(),
                                                 cpu_loss_template(), cpu_loss_backward_template(),
                                                 cpu_batch_norm_backward_template(), cpu_group_norm_backward_template(), cpu_embedding_backward_template(),
                                                 cpu_cross_entropy_template(), cpu_cross_entropy_backward_template(),
                                                 cpu_rms_norm_template(), cpu_rms_norm_backward_template(),
                                                 cpu_kl_div_template(), cpu_kl_div_backward_template()};
  return v;
}

}  // namespace kc::evolve
