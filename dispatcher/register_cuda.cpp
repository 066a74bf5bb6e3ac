// Interception kernels at the CUDA dispatch key, falling back to at::cuda::<op>, on PyTorch's current stream.
#include <ATen/ATen.h>
#include <ATen/CUDAFunctions.h>
#include <ATen/ops/binary_cross_entropy_with_logits_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/huber_loss_backward_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/logsumexp_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/smooth_l1_loss_backward_compositeexplicitautograd_dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "dispatcher/call.h"
#include "dispatcher/intercept.h"
#include "dispatcher/registry.h"
#include "runtime/cuda_api.h"

namespace kc::dispatch {

#define KC_NS cuda
#define KC_DEV Dev::kCuda
#include "dispatcher/wrappers.inc"
#undef KC_NS
#undef KC_DEV

namespace {
void* current_stream(int device) { return c10::cuda::getCurrentCUDAStream(device).stream(); }
// Through the lazily loaded driver (torch's inline helper would link libcudart into us).
bool capturing(int device) {
  auto d = cuda_driver();
  if (!d) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstream s = reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(device).stream());
  if (d.value()->cuStreamIsCapturing(s, &st) != CUDA_SUCCESS) return true;   // unsure: do not load
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}
}  // namespace

bool register_cuda(torch::Library& lib, OpId op) {
  cuda_hooks().stream = &current_stream;
  cuda_hooks().capturing = &capturing;
  if (!register_one(lib, op)) return false;
  return register_cudnn_batch_norm(lib, op);
}

}  // namespace kc::dispatch
