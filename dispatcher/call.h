// One intercepted call: collects the arguments, builds the key, and serves a cached kernel or runs
// the original implementation. Used by the per-op wrappers (wrappers.inc) for both backends.
#pragma once
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "dispatcher/state.h"
#include "kernel_cache/key.h"
#include "runtime/tensor_meta.h"

namespace kc::dispatch {

DType to_dtype(at::ScalarType t);
TensorMeta to_meta(const char* name, const at::Tensor& t);

// Results of aten ops (a tensor or a tuple of tensors) as a flat list of tensors and back.
inline std::vector<at::Tensor> as_list(const at::Tensor& t) { return {t}; }
template <class... T> std::vector<at::Tensor> as_list(const std::tuple<T...>& t) {
  return std::apply([](const auto&... x) { return std::vector<at::Tensor>{x...}; }, t);
}
template <class R> struct FromList;
template <> struct FromList<at::Tensor> {
  static at::Tensor make(std::vector<at::Tensor>& v) { return std::move(v[0]); }
};
template <class... T> struct FromList<std::tuple<T...>> {
  template <size_t... I> static std::tuple<T...> make(std::vector<at::Tensor>& v, std::index_sequence<I...>) {
    return {std::move(v[I])...};
  }
  static std::tuple<T...> make(std::vector<at::Tensor>& v) { return make(v, std::index_sequence_for<T...>{}); }
};
template <class R> R from_list(std::vector<at::Tensor>& v) { return FromList<R>::make(v); }

// Device-specific pieces, installed by register_cuda.cpp when built with CUDA.
struct DeviceHooks {
  void* (*stream)(int device) = nullptr;       // PyTorch's current stream on `device`
  bool (*capturing)(int device) = nullptr;     // is that stream capturing a CUDA graph?
};
DeviceHooks& cuda_hooks();

// While one lives on this thread, every Call is inactive: the ops an eager implementation calls
// run as PyTorch's, untouched and unrecorded. Set around the eager of an op whose implementation is
// a composite of other intercepted ops (logsumexp's amax and sum; wrappers.inc), so that a miss
// does not also search, and later serve, keys that are never reached once the op is served.
struct EagerOnly {
  EagerOnly();
  ~EagerOnly();
  EagerOnly(const EagerOnly&) = delete;
  EagerOnly& operator=(const EagerOnly&) = delete;
};

class Call {
 public:
  // The most tensor and scalar arguments one call binds. An op with more is not intercepted
  // (set_arg_names refuses it): a launch spec may name any scalar of the key, so none may be
  // dropped from the binding (native_group_norm's fifth scalar, eps, once was).
  static constexpr int kMaxTensors = 8;
  static constexpr int kMaxScalars = 8;

  // lead: the tensor whose device the call runs on (the op's first tensor argument).
  Call(OpId op, Dev dev, const at::Tensor& lead);
  bool active() const { return active_; }   // false: the op is switched off, run eager untouched

  void t(const char* name, const at::Tensor& x);
  void t(const char* name, const std::optional<at::Tensor>& x);
  void i(const char* name, int64_t v);
  void d(const char* name, double v);
  void b(const char* name, bool v);
  void s(const char* name, std::string_view v);
  void list(const char* name, at::IntArrayRef v);

  // Instead of, or before, run(), for one call of a composite's pair (dispatcher/composite.h):
  // whether the key has a kernel to serve or a record to load (kReady; a later run() of the key
  // loads it), has none yet (kPending: a miss), or is answered by eager for good here (kSettled:
  // eager_best, disabled, or nondeterministic where determinism is required). Never serves or
  // runs anything; a first miss requests the key's evolution, with the call's inputs as a
  // captured set only if `capture` (placeholders must not be).
  enum class Readiness { kReady, kPending, kSettled };
  Readiness readiness(bool capture);
  bool ready(bool capture) { return readiness(capture) == Readiness::kReady; }
  // Inside run()'s eager: true when eager's outputs will be compared with the kernel's (a live
  // check), so every output must be computed.
  bool compares() const { return checking_ != nullptr; }

  template <class R, class Eager>
  R run(Eager&& eager) {
    if (!active_) return eager();
    std::vector<at::Tensor> outs;
    Outcome o = before(outs);
    if (o == Outcome::kServed) return from_list<R>(outs);
    if (o == Outcome::kShadow) {   // eager first, on the inputs as the caller gave them
      const auto t0 = std::chrono::steady_clock::now();
      R r = eager();
      if (shadow(outs, as_list(r), t0)) return from_list<R>(outs);
      return r;
    }
    if (o == Outcome::kProbe) {   // eager's result answers; the served kernel is timed beside it
      std::optional<R> r;
      probe(outs, [&]() -> Status {
        r.emplace(eager());
        return Status::ok();
      });
      if (!r) r.emplace(eager());   // the probe could not run eager (no timer): run it now
      if (checking_) check_probe(outs, as_list(*r));
      return std::move(*r);
    }
    R r = eager();
    if (o == Outcome::kLoad) after_load(as_list(r));
    else if (o == Outcome::kEvolve) evolve();
    return r;
  }

 private:
  enum class Outcome { kServed, kEager, kLoad, kEvolve, kProbe, kShadow };
  Outcome before(std::vector<at::Tensor>& outs);   // serve if possible; counts the call
  void after_load(const std::vector<at::Tensor>& eager_outs);
  void evolve(bool capture = true);   // first miss of the key here: submit an evolution job (dispatcher/evolution.h)
  // One probe pair (dispatcher/probe.h): `eager_fn` runs eager once, the served kernel once, each
  // timed; demotes the key when the probe's last pair shows it is not faster here.
  void probe(std::vector<at::Tensor>& outs, const std::function<Status()>& eager_fn);
  // A live check (dispatcher/shadow.h) after eager ran: launches the kernel into `outs` and compares.
  // True: serve `outs` (they matched); false: answer with eager's result (mismatch or failure).
  // t0: when the extra eager call began (the check's time, kernel launch included, is counted).
  bool shadow(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& eager_outs,
              std::chrono::steady_clock::time_point t0);
  // A probe call due for a live check: both results exist already; compare them.
  void check_probe(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& eager_outs);
  // The live check's verdict for `k`; a mismatch disables it here and in the cache. True on a match.
  bool judge_shadow(const LoadedKernel& k, const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& eager_outs);
  Status launch(LoadedKernel& k, std::vector<at::Tensor>& outs);
  Binding binding(const std::vector<at::Tensor>& outs) const;
  bool capturing() const;
  bool room_for_scalar();   // false (and the call inactive) when the binding is full

  OpId op_;
  Dev dev_;
  bool active_;
  int device_ = 0;
  std::optional<KeyBuilder> kb_;
  std::string key_;
  std::shared_ptr<const Record> loading_;
  std::shared_ptr<LoadedKernel> probing_;
  std::shared_ptr<LoadedKernel> checking_;   // kShadow, or a kProbe call due for a live check
  bool probe_ran_ = false;                   // the probe's kernel side ran and succeeded
  std::array<const at::Tensor*, kMaxTensors> tensors_{};
  std::array<const char*, kMaxTensors> tnames_{};
  int nt_ = 0;
  std::array<ScalarArg, kMaxScalars> scalars_;
  int ns_ = 0;
};

}  // namespace kc::dispatch
