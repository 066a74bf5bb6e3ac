// Composites caught above autograd as one call (runtime/ops.def KC_COMPOSITE rows): a kernel at
// AutogradCPU / AutogradCUDA that serves kernelcraft's own forward and backward pair, with a C++
// autograd node between them, or runs PyTorch's composite itself. One file per composite:
// dispatcher/cross_entropy.cpp, dispatcher/rms_norm.cpp, dispatcher/kl_div.cpp, and one without a
// backward: dispatcher/max_pool.cpp (the values of a max pool that wants no gradient).
#pragma once
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/library.h>

#include "dispatcher/call.h"
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

// The forward's flow every composite shares. `c`: the forward's Call, its key bound; `bwd_ready()`:
// the backward's key can answer, or no gradient is needed (a first miss requests its evolution).
// The forward's key is asked first: where eager answers it for good (eager_best, disabled), the
// pair's backward would never run, so its key is not built (that cost a served-backward
// RMSNorm 13% of eager's time per call on the H200). Either not ready: PyTorch's composite
// (`own`), the call counted and the missing keys' evolution requested, so the pair is searched
// together. Else the pair's forward through c.run, whose eager (`eager`: own()'s output and the statistic the
// node saves, computed only when c.compares()) stands in for the kernel; an output that is own()'s
// keeps PyTorch's graph, a kernel's gets the composite's node from `attach(out, stat)` when a
// gradient is needed.
template <class BwdReady, class Own, class Eager, class Attach>
at::Tensor serve_forward(Call& c, BwdReady&& bwd_ready, bool grad, Own&& own, Eager&& eager, Attach&& attach) {
  const Call::Readiness fwd = c.readiness(/*capture=*/true);
  if (fwd == Call::Readiness::kSettled) return own();
  if (!bwd_ready() || fwd != Call::Readiness::kReady) return own();
  std::optional<at::Tensor> eager_out;
  auto [out, stat] = c.run<std::tuple<at::Tensor, at::Tensor>>([&] {
    auto r = eager();
    eager_out = std::get<0>(r);
    return r;
  });
  if (eager_out && out.is_same(*eager_out)) return out;   // PyTorch's own result and graph
  return grad ? attach(std::move(out), stat) : out;
}

// Installs `fn` (a TORCH_FN) for aten::`name` at AutogradCPU and, built with CUDA, AutogradCUDA.
// The libraries are leaked on purpose, as the backend libraries are (registry.cpp).
template <class Fn> void impl_above_autograd(const char* name, Fn fn, const char* file, uint32_t line) {
  auto* cpu = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCPU, file, line);
  cpu->impl(name, fn);
#ifdef KC_WITH_CUDA
  auto* cuda = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCUDA, file, line);
  cuda->impl(name, fn);
#endif
}

// Installs the above-autograd kernel of composite row `op` (a backward row is installed with its
// forward: true). False (with a log line) if it could not be registered; throws nothing.
bool register_composite(OpId op);

// One per composite's file: installs its kernel at AutogradCPU and AutogradCUDA; may throw.
void register_cross_entropy();   // aten::cross_entropy_loss (cross_entropy.cpp)
void register_rms_norm();        // aten::rms_norm (rms_norm.cpp)
void register_kl_div();          // aten::kl_div (kl_div.cpp)
void register_max_pool(OpId op); // aten::max_pool2d or max_pool3d, by its values row (max_pool.cpp)

}  // namespace kc::dispatch
