// Registration of the interception kernels with the dispatcher, per backend key.
#pragma once
#include <torch/library.h>

#include "runtime/ops.h"

namespace kc::dispatch {

// False (with a log line) if the op could not be registered.
bool register_cpu(torch::Library& lib, OpId op);
#ifdef KC_WITH_CUDA
bool register_cuda(torch::Library& lib, OpId op);
// cudnn_batch_norm's kernel, installed with native_batch_norm's, and cudnn_batch_norm_backward's,
// with native_batch_norm_backward's (dispatcher/cudnn_batch_norm.cpp); nothing for other ops.
bool register_cudnn_batch_norm(torch::Library& lib, OpId op);
#endif

}  // namespace kc::dispatch
