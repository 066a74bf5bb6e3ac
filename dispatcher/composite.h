// Composites caught above autograd as one call (runtime/ops.def KC_COMPOSITE rows): a kernel at
// AutogradCPU / AutogradCUDA that serves kernelcraft's own forward and backward pair, with a C++
// autograd node between them, or runs PyTorch's composite itself. One file per composite:
// dispatcher/cross_entropy.cpp, dispatcher/rms_norm.cpp.
#pragma once
#include <memory>
#include <type_traits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>

#include "runtime/ops.h"

namespace kc::dispatch {

// A dense CPU or CUDA tensor on `lead`'s device with nothing above it (no Python or
// __torch_dispatch__ subclass, fake tensor, functorch or functionalization wrapper, conjugate or
// negative view, forward-AD tangent): what a kernel reads is what eager reads. Undefined: true.
bool plain_tensor(const at::Tensor& t, const at::Tensor& lead);
// No dispatch mode is active (FakeTensorMode, a __torch_dispatch__ mode): the call is plain eager.
bool no_dispatch_mode();

// CUDA autocast on for its scope when `on` (the composite's eager recomputed as the user's call
// ran), restored after; nothing when `on` is false.
class CudaAutocast {
 public:
  explicit CudaAutocast(bool on);
  ~CudaAutocast();
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool on_, was_;
};

// The autograd node pointer of the installed torch (shared_ptr up to torch 2.11, intrusive_ptr
// later), and a new node of type N owned by one; `raw` is the node, to fill in.
using NodePtr = decltype(torch::autograd::Edge::function);
template <class N> NodePtr new_node(N*& raw) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    auto p = std::make_shared<N>();
    raw = p.get();
    return p;
  } else {
    auto p = c10::make_intrusive<N>();
    raw = p.get();
    return p;
  }
}

// Installs the above-autograd kernel of composite row `op` (a backward row is installed with its
// forward: true). False (with a log line) if it could not be registered; throws nothing.
bool register_composite(OpId op);

// One per composite's file: installs its kernel at AutogradCPU and AutogradCUDA; may throw.
void register_cross_entropy();   // aten::cross_entropy_loss (cross_entropy.cpp)
void register_rms_norm();        // aten::rms_norm (rms_norm.cpp)

}  // namespace kc::dispatch
