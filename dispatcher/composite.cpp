// What every composite caught above autograd shares (dispatcher/composite.h).
#include "dispatcher/composite.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <typeinfo>

#include "runtime/log.h"

namespace kc::dispatch {

bool plain_tensor(const at::Tensor& t, const at::Tensor& lead) {
  if (!t.defined()) return true;
  if (t.layout() != at::kStrided || t.is_nested() || t.device() != lead.device()) return false;
  if (!(t.is_cpu() || t.is_cuda()) || t.is_conj() || t.is_neg()) return false;
  if (typeid(*t.unsafeGetTensorImpl()) != typeid(c10::TensorImpl)) return false;   // functorch, functionalization
  constexpr c10::DispatchKeySet kAbove({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                        c10::DispatchKey::Functionalize, c10::DispatchKey::ZeroTensor});
  if (t.key_set().has_any(kAbove)) return false;   // fake tensors and __torch_dispatch__ subclasses
  return !t._fw_grad(/*level=*/0).defined();
}

bool no_dispatch_mode() { return !c10::impl::TorchDispatchModeTLS::any_modes_set(); }

CudaAutocast::CudaAutocast(bool on) : on_(on), was_(at::autocast::is_autocast_enabled(at::kCUDA)) {
  if (on_) at::autocast::set_autocast_enabled(at::kCUDA, true);
}

CudaAutocast::~CudaAutocast() {
  if (!on_) return;
  at::autocast::set_autocast_enabled(at::kCUDA, was_);
  if (!was_) at::autocast::clear_cache();
}

bool register_composite(OpId op) {
  try {
    switch (op) {
      case OpId::kCrossEntropy: register_cross_entropy(); return true;
      case OpId::kRmsNorm: register_rms_norm(); return true;
      case OpId::kKlDiv: register_kl_div(); return true;
      case OpId::kMaxPool2dValues:
      case OpId::kMaxPool3dValues: register_max_pool(op); return true;
      case OpId::kCrossEntropyBackward:
      case OpId::kRmsNormBackward:
      case OpId::kKlDivBackward: return true;   // installed with its forward
      default: return false;
    }
  } catch (const std::exception& e) {
    log(LogLevel::kWarn, std::string("could not intercept ") + op_info(op).name + ": " + e.what());
    return false;
  }
}

}  // namespace kc::dispatch
