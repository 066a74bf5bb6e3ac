// Composites caught above autograd as one call (runtime/ops.def KC_COMPOSITE rows): a kernel at
// AutogradCPU / AutogradCUDA that serves kernelcraft's own forward and backward pair, with a C++
// autograd node between them, or runs PyTorch's composite itself. One file per composite:
// dispatcher/cross_entropy.cpp.
#pragma once
#include "runtime/ops.h"

namespace kc::dispatch {

// Installs the above-autograd kernel of composite row `op` (a backward row is installed with its
// forward: true). False (with a log line) if it could not be registered; throws nothing.
bool register_composite(OpId op);

}  // namespace kc::dispatch
