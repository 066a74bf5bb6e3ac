// Interception kernels at the CPU dispatch key, falling back to at::cpu::<op>.
#include <ATen/ATen.h>
#include <ATen/CPUFunctions.h>
#include <ATen/ops/binary_cross_entropy_with_logits_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/huber_loss_backward_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/logsumexp_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/smooth_l1_loss_backward_compositeexplicitautograd_dispatch.h>
#include <torch/library.h>

#include "dispatcher/call.h"
#include "dispatcher/intercept.h"
#include "dispatcher/registry.h"

namespace kc::dispatch {

#define KC_NS cpu
#define KC_DEV Dev::kCpu
#include "dispatcher/wrappers.inc"
#undef KC_NS
#undef KC_DEV

bool register_cpu(torch::Library& lib, OpId op) { return register_one(lib, op); }

}  // namespace kc::dispatch
