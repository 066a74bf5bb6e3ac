// Registration of the interception kernels with the dispatcher, per backend key.
#pragma once
#include <torch/library.h>

#include "runtime/ops.h"

namespace kc::dispatch {

void register_cpu(torch::Library& lib, OpId op);
#ifdef KC_WITH_CUDA
void register_cuda(torch::Library& lib, OpId op);
#endif

}  // namespace kc::dispatch
