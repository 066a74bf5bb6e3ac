// Double-precision references for the CPU template tests (test_templates_cpu.cpp): the exact
// value of every output of the 16 default ops from the float inputs, with a per-element scale
// that follows the formula's conditioning.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "evolve/ops/op_call.h"

namespace kc::evolve::cpu_ref {

// Buffers by binding tensor name; outputs are poisoned with NaN.
using Buffers = std::map<std::string, std::vector<float>>;

// An element passes when |got - ref| <= k * FLT_EPSILON * scale (+ 1e-37 for results that
// underflow float).
struct Expect {
  std::vector<double> ref, scale;
  double k = 8;
};

// The loss families (template_cpu_loss.cpp): the values their inputs must take, drawn over the
// harness's normal ones, and their references.
void loss_inputs(const OpCall& c, Buffers& b, uint64_t seed);
void loss(const OpCall& c, Buffers& b, std::vector<Expect>& out);
void loss_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out);

// Batch norm backward (template_cpu_batch_norm_backward.cpp): save_mean / save_invstd as the
// forward saves them (training), and the references of grad_input, grad_weight and grad_bias.
void batch_norm_backward_inputs(const OpCall& c, Buffers& b);
void batch_norm_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out);

// Group norm backward (template_cpu_group_norm_backward.cpp): mean / rstd as the forward saves
// them, and the references of grad_input, grad_weight and grad_bias.
void group_norm_backward_inputs(const OpCall& c, Buffers& b);
void group_norm_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out);
// Embedding backward (template_cpu_embedding_backward.cpp): indices with repeats, padding_idx and
// out-of-range values (int64: two floats an element, int32: one), and the reference.
void embedding_backward_inputs(const OpCall& c, Buffers& b, uint64_t seed);
void embedding_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out);

// One Expect per output of `c` (empty for outputs the call does not produce).
std::vector<Expect> reference(const OpCall& c, Buffers& b);
// Pooling backward (template_cpu_reference_pool.cpp): grad_input by the scatter of the definition.
void pool_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out);
// Max pooling backward's `indices` input: the forward's argmax of b["self"] (int64, two floats an
// element), as training saves it.
void argmax_indices(const OpCall& c, Buffers& b);
// "" when `got` is within `e`; otherwise the first few mismatches.
std::string compare(const std::vector<float>& got, const Expect& e);

}  // namespace kc::evolve::cpu_ref
