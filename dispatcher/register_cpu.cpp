// Interception kernels at the CPU dispatch key, falling back to at::cpu::<op>.
#include <ATen/ATen.h>
#include <ATen/ops/_log_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_log_softmax_cpu_dispatch.h>
#include <ATen/ops/_softmax_backward_data_cpu_dispatch.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <ATen/ops/gelu_backward_cpu_dispatch.h>
#include <ATen/ops/gelu_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_backward_cpu_dispatch.h>
#include <ATen/ops/native_layer_norm_cpu_dispatch.h>
#include <ATen/ops/relu_cpu_dispatch.h>
#include <ATen/ops/sigmoid_backward_cpu_dispatch.h>
#include <ATen/ops/sigmoid_cpu_dispatch.h>
#include <ATen/ops/silu_backward_cpu_dispatch.h>
#include <ATen/ops/silu_cpu_dispatch.h>
#include <ATen/ops/tanh_backward_cpu_dispatch.h>
#include <ATen/ops/tanh_cpu_dispatch.h>
#include <ATen/ops/threshold_backward_cpu_dispatch.h>
#include <torch/library.h>

#include "dispatcher/call.h"
#include "dispatcher/registry.h"

namespace kc::dispatch {

#define KC_NS cpu
#define KC_DEV Dev::kCpu
#include "dispatcher/wrappers.inc"
#undef KC_NS
#undef KC_DEV

void register_cpu(torch::Library& lib, OpId op) { register_one(lib, op); }

}  // namespace kc::dispatch
