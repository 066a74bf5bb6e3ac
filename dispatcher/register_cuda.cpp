// Interception kernels at the CUDA dispatch key, falling back to at::cuda::<op>, on PyTorch's current stream.
#include <ATen/ATen.h>
#include <ATen/ops/_log_softmax_backward_data_cuda_dispatch.h>
#include <ATen/ops/_log_softmax_cuda_dispatch.h>
#include <ATen/ops/_softmax_backward_data_cuda_dispatch.h>
#include <ATen/ops/_softmax_cuda_dispatch.h>
#include <ATen/ops/gelu_backward_cuda_dispatch.h>
#include <ATen/ops/gelu_cuda_dispatch.h>
#include <ATen/ops/native_layer_norm_backward_cuda_dispatch.h>
#include <ATen/ops/native_layer_norm_cuda_dispatch.h>
#include <ATen/ops/relu_cuda_dispatch.h>
#include <ATen/ops/sigmoid_backward_cuda_dispatch.h>
#include <ATen/ops/sigmoid_cuda_dispatch.h>
#include <ATen/ops/silu_backward_cuda_dispatch.h>
#include <ATen/ops/silu_cuda_dispatch.h>
#include <ATen/ops/tanh_backward_cuda_dispatch.h>
#include <ATen/ops/tanh_cuda_dispatch.h>
#include <ATen/ops/threshold_backward_cuda_dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "dispatcher/call.h"
#include "dispatcher/registry.h"

namespace kc::dispatch {

#define KC_NS cuda
#define KC_DEV Dev::kCuda
#include "dispatcher/wrappers.inc"
#undef KC_NS
#undef KC_DEV

namespace {
void* current_stream(int device) { return at::cuda::getCurrentCUDAStream(device).stream(); }
bool capturing(int device) {
  return at::cuda::currentStreamCaptureStatusMayInitCtx() != at::cuda::CaptureStatus::None;
}
}  // namespace

void register_cuda(torch::Library& lib, OpId op) {
  cuda_hooks().stream = &current_stream;
  cuda_hooks().capturing = &capturing;
  register_one(lib, op);
}

}  // namespace kc::dispatch
