// The gauntlet's setup: the device and backend, the reference input sets (captured first), the
// shared-memory scrubber, and eager's timing; the stages themselves are in gauntlet.cpp.
#include <chrono>

#include "evolve/verify/gauntlet_impl.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_api.h"
#include "runtime/log.h"

namespace kc::evolve {

namespace {

// The current context's device's free memory (0 where the driver cannot say).
int64_t device_free_bytes() {
  auto d = cuda_driver();
  size_t free_b = 0, total_b = 0;
  if (!d || d.value()->cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS) return 0;
  return static_cast<int64_t>(free_b);
}

}  // namespace

Gauntlet::Gauntlet(std::unique_ptr<Impl> p) : p_(std::move(p)) {}
Gauntlet::~Gauntlet() = default;
const OpCall& Gauntlet::call() const { return p_->call; }
bool Gauntlet::context_lost() const { return p_->lost; }
bool Gauntlet::sets_resident() const { return p_->resident; }
std::vector<std::string> Gauntlet::set_names() const {
  std::vector<std::string> v;
  for (const auto& s : p_->sets) v.push_back(s.name);
  return v;
}

Result<std::unique_ptr<Gauntlet>> Gauntlet::create(OpCall call, int device, std::vector<at::Tensor> captured,
                                                   GauntletOptions o) {
  auto impl = std::make_unique<Impl>();
  impl->call = std::move(call);
  impl->device = device;
  impl->opt = std::move(o);
  try {
    auto be = backend_for(impl->call.backend, device);
    if (!be) return be.status();
    impl->be = be.value();
    if (impl->cuda()) {
      impl->dev = at::Device(at::kCUDA, static_cast<at::DeviceIndex>(device));
      at::empty({1}, at::TensorOptions().device(impl->dev));   // torch's context first: the primary one
      impl->make_scrubber();
    }
    const OpCall& c = impl->call;
    impl->resident = evolve::sets_resident(c, impl->cuda() ? device_free_bytes() : 0);   // memory_cap.h
    bool captured_ok = captured.size() == c.inputs.size();
    for (size_t k = 0; captured_ok && k < captured.size(); ++k) {
      const TensorMeta& m = c.inputs[k];
      const at::Tensor& t = captured[k];
      captured_ok = t.defined() == m.defined &&
                    (!m.defined || (t.sizes().vec() == m.sizes && t.scalar_type() == to_scalar_type(m.dtype)));
    }
    if (captured_ok && !captured.empty()) {
      std::vector<at::Tensor> in;
      for (size_t k = 0; k < captured.size(); ++k) {
        if (!captured[k].defined()) {
          in.emplace_back();
          continue;
        }
        at::Tensor t = empty_like_meta(c.inputs[k], impl->dev);
        t.copy_(captured[k]);
        in.push_back(t);
      }
      KC_RETURN_IF_ERROR(impl->make_set({"captured", 0, std::move(in)}));
    } else if (!captured.empty()) {
      log(LogLevel::kWarn, "captured inputs do not match the key; using generated inputs only");
    }
    uint64_t seed = 1;
    for (const auto& kind : input_kinds(c.op))
      KC_RETURN_IF_ERROR(impl->make_set({kind, seed++, {}}));
    KC_RETURN_IF_ERROR(impl->sync());
  } catch (const std::exception& e) {
    return Status::error(Code::kUnavailable, std::string("reference setup failed: ") + e.what());
  }
  return std::unique_ptr<Gauntlet>(new Gauntlet(std::move(impl)));
}

Result<Timing> Gauntlet::eager_timing() {
  if (p_->eager) return *p_->eager;
  Impl& m = *p_;
  const int ni = m.normal_index();
  if (ni < 0) return Status::error(Code::kInvalid, "no normal input set");
  InputSet tmp;
  auto normal = m.acquire(ni, &tmp);
  if (!normal) return normal.status();
  TimingOptions to;
  to.budget_ms = m.opt.timing_budget_ms;
  auto fn = [&]() -> Status { return m.eager_call(normal.value()->inputs); };
  auto t = m.cuda() ? time_cuda(nullptr, fn, to) : time_cpu(fn, to);
  if (t) m.eager = t.value();
  return t;
}

}  // namespace kc::evolve
