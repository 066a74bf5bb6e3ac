// The serving path of one intercepted call: key -> table -> launch a cached kernel, or eager.
#include "dispatcher/call.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <functional>

#include <ATen/Parallel.h>

#include "dispatcher/evolution.h"
#include "dispatcher/probe.h"
#include "dispatcher/shadow.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/log.h"
#include "runtime/timing.h"

namespace kc::dispatch {

DeviceHooks& cuda_hooks() {
  static DeviceHooks h;
  return h;
}

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kF32;
    case at::kDouble: return DType::kF64;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kBool: return DType::kBool;
    default: return DType::kOther;
  }
}

TensorMeta to_meta(const char* name, const at::Tensor& t) {
  TensorMeta m;
  m.name = name;
  if (!t.defined()) {
    m.defined = false;
    return m;
  }
  m.dtype = to_dtype(t.scalar_type());
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  m.strides.assign(t.strides().begin(), t.strides().end());
  m.align = align_class(t.data_ptr());
  return m;
}

namespace {
thread_local int t_eager_only = 0;
}  // namespace

EagerOnly::EagerOnly() { ++t_eager_only; }
EagerOnly::~EagerOnly() { --t_eager_only; }

Call::Call(OpId op, Dev dev, const at::Tensor& lead) : op_(op), dev_(dev) {
  State& st = State::get();
  active_ = t_eager_only == 0 && st.on(op);
  if (!active_) return;
  device_ = dev == Dev::kCuda ? lead.get_device() : 0;
  kb_.emplace(st.target(dev, device_), op_info(op).aten, st.policy());
}

void Call::t(const char* name, const at::Tensor& x) {
  if (!active_) return;
  if (nt_ == kMaxTensors) { active_ = false; return; }
  tensors_[nt_] = &x;
  tnames_[nt_++] = name;
  if (!x.defined()) {
    kb_->absent(name);
    return;
  }
  kb_->tensor(name, to_dtype(x.scalar_type()), x.sizes().data(), x.strides().data(), x.dim(),
              x.numel() ? align_class(x.data_ptr()) : 16);
}

void Call::t(const char* name, const std::optional<at::Tensor>& x) {
  static const at::Tensor undefined;
  t(name, x.has_value() ? *x : undefined);
}

// A call with more scalars than the binding holds runs eager untouched (set_arg_names keeps such
// ops out, so this is a guard, never the normal path).
bool Call::room_for_scalar() {
  if (ns_ < kMaxScalars) return true;
  active_ = false;
  return false;
}

void Call::i(const char* name, int64_t v) {
  if (!active_) return;
  kb_->i(name, v);
  if (room_for_scalar()) scalars_[ns_++] = ScalarArg{name, v};
}
void Call::d(const char* name, double v) {
  if (!active_) return;
  kb_->d(name, v);
  if (room_for_scalar()) scalars_[ns_++] = ScalarArg{name, v};
}
void Call::b(const char* name, bool v) {
  if (!active_) return;
  kb_->b(name, v);
  if (room_for_scalar()) scalars_[ns_++] = ScalarArg{name, v};
}
void Call::s(const char* name, std::string_view v) {
  if (!active_) return;
  kb_->s(name, std::string(v));
  if (room_for_scalar()) scalars_[ns_++] = ScalarArg{name, std::string(v)};
}
void Call::list(const char* name, at::IntArrayRef v) {
  if (!active_) return;
  kb_->list(name, v.data(), v.size());
  if (room_for_scalar()) scalars_[ns_++] = ScalarArg{name, std::vector<int64_t>(v.begin(), v.end())};
}

bool Call::capturing() const {
  return dev_ == Dev::kCuda && cuda_hooks().capturing && cuda_hooks().capturing(device_);
}

Call::Outcome Call::before(std::vector<at::Tensor>& outs) {
  State& st = State::get();
  OpCounters& c = st.counters(op_);
  if (key_.empty()) key_ = kb_->take();   // readiness() may have built it
  KernelTable& table = st.table();
  KernelTable::Lookup l = table.find(key_);
  switch (l.kind) {
    case KernelTable::Kind::kServe: {
      if (!l.kernel->bitwise_deterministic && st.determinism_required()) {
        c.fallbacks.fetch_add(1, std::memory_order_relaxed);
        c.nondeterministic.fetch_add(1, std::memory_order_relaxed);
        return Outcome::kEager;
      }
      // Graph capture: neither a host sync nor a second, uncaptured result is possible.
      const int first = l.kernel->verified_here ? st.shadow_calls() : st.shadow_calls_not_verified_here();
      const int every = st.shadow_every();
      const bool check = (first > 0 || every > 0) && !capturing() &&
                         shadow_due(l.kernel->served_calls.fetch_add(1, std::memory_order_relaxed), l.kernel->salt,
                                    first, every);
      if (l.kernel->probe.left.load(std::memory_order_relaxed) > 0 && !capturing()) {
        c.probes.fetch_add(1, std::memory_order_relaxed);
        if (check) checking_ = l.kernel;
        probing_ = std::move(l.kernel);
        return Outcome::kProbe;
      }
      if (check) {
        c.shadow_checks.fetch_add(1, std::memory_order_relaxed);
        checking_ = std::move(l.kernel);
        return Outcome::kShadow;
      }
      Status s = launch(*l.kernel, outs);
      if (s) {
        c.hits.fetch_add(1, std::memory_order_relaxed);
        return Outcome::kServed;
      }
      if (s.code() == Code::kUnsupported) {   // pointers less aligned than verified: a miss here
        c.fallbacks.fetch_add(1, std::memory_order_relaxed);
        outs.clear();
        return Outcome::kEager;
      }
      table.disable(key_, s.to_string());
      c.fallbacks.fetch_add(1, std::memory_order_relaxed);
      return Outcome::kEager;
    }
    case KernelTable::Kind::kLoad:
      c.fallbacks.fetch_add(1, std::memory_order_relaxed);
      if (capturing()) {   // loading a module is not capturable: leave it for a later call
        table.defer_load(key_, l.record);
        return Outcome::kEager;
      }
      loading_ = l.record;
      return Outcome::kLoad;
    case KernelTable::Kind::kDisabled:
      c.fallbacks.fetch_add(1, std::memory_order_relaxed);
      return Outcome::kEager;
    case KernelTable::Kind::kEagerBest:
    case KernelTable::Kind::kMiss:
      c.misses.fetch_add(1, std::memory_order_relaxed);
      if (l.first_miss) {
        st.record_miss(key_);
        if (l.kind == KernelTable::Kind::kMiss && !capturing()) return Outcome::kEvolve;
      }
      return Outcome::kEager;
  }
  return Outcome::kEager;
}

void Call::evolve(bool capture) {
  std::vector<const at::Tensor*> in;
  if (capture) in.assign(tensors_.begin(), tensors_.begin() + nt_);
  request_evolution(key_, dev_ == Dev::kCuda, device_, in);
}

Call::Readiness Call::readiness(bool capture) {
  if (!active_) return Readiness::kSettled;
  State& st = State::get();
  if (key_.empty()) key_ = kb_->take();
  KernelTable& table = st.table();
  KernelTable::Lookup l = table.find(key_);
  switch (l.kind) {
    case KernelTable::Kind::kServe:
      return l.kernel->bitwise_deterministic || !st.determinism_required() ? Readiness::kReady : Readiness::kSettled;
    case KernelTable::Kind::kLoad:
      table.defer_load(key_, l.record);   // found again, and loaded, by the run() that follows
      return Readiness::kReady;
    case KernelTable::Kind::kMiss:
      st.counters(op_).misses.fetch_add(1, std::memory_order_relaxed);
      if (l.first_miss) {
        st.record_miss(key_);
        if (!capturing()) evolve(capture);
      }
      return Readiness::kPending;
    case KernelTable::Kind::kEagerBest:
      st.counters(op_).misses.fetch_add(1, std::memory_order_relaxed);
      return Readiness::kSettled;
    case KernelTable::Kind::kDisabled:
      st.counters(op_).fallbacks.fetch_add(1, std::memory_order_relaxed);
      return Readiness::kSettled;
  }
  return Readiness::kSettled;
}

Binding Call::binding(const std::vector<at::Tensor>& outs) const {
  Binding b;
  for (int k = 0; k < nt_; ++k) b.tensors.push_back(to_meta(tnames_[k], *tensors_[k]));
  for (size_t k = 0; k < outs.size(); ++k)
    b.tensors.push_back(to_meta(("out" + std::to_string(k)).c_str(), outs[k]));
  for (int k = 0; k < ns_; ++k) b.scalars.push_back(scalars_[k]);
  return b;
}

void Call::after_load(const std::vector<at::Tensor>& eager_outs) {
  KernelTable& table = State::get().table();
  const Record& r = *loading_;
  if (r.key != key_ || r.backend != dev_) {
    table.disable(key_, "record does not belong to this key or backend");
    return;
  }
  if (!record_verified(r) && !State::get().config().serve_unverified)
    return table.disable(key_, "the record was stored without verification; store it with `kernelcraft cache put "
                               "--verify`, or set KERNELCRAFT_SERVE_UNVERIFIED=1 to serve it anyway");
  auto spec = parse_launch_spec(r.launch);
  if (!spec) return table.disable(key_, "launch spec: " + spec.status().to_string());
  Binding b = binding(eager_outs);
  auto resolved = resolve(spec.value(), b);
  if (!resolved) return table.disable(key_, "launch spec: " + resolved.status().to_string());
  auto be = backend_for(dev_, device_);
  if (!be) return table.disable(key_, std::string(backend_name(dev_)) + " backend: " + be.status().to_string());
  auto launcher = be.value()->load(r.blob, resolved.value());
  if (!launcher) return table.disable(key_, "load: " + launcher.status().to_string());
  auto k = std::make_shared<LoadedKernel>();
  k->key = key_;
  k->record = loading_;
  k->spec = std::move(resolved.value());
  for (size_t j = nt_; j < b.tensors.size(); ++j) k->outputs.push_back(b.tensors[j]);
  for (const TensorMeta& m : b.tensors) k->align.push_back(m.align);
  k->launcher = std::move(launcher.value());
  k->salt = std::hash<std::string>{}(key_);
  k->bitwise_deterministic = r.determinism == Determinism::kBitwise;
  k->verified_here = record_verified_here(r);
  arm_probe(k->probe, State::get().config().serve_probe_calls);
  table.install(std::move(k));
}

void Call::probe(std::vector<at::Tensor>& outs, const std::function<Status()>& eager_fn) {
  std::shared_ptr<LoadedKernel> k = std::move(probing_);
  void* stream = nullptr;
  if (dev_ == Dev::kCuda) {
    if (!cuda_hooks().stream) return;
    stream = cuda_hooks().stream(device_);
  }
  auto timed = [&](const std::function<Status()>& f) {
    return dev_ == Dev::kCuda ? time_once_cuda(stream, f) : time_once_cpu(f);
  };
  auto served_fn = [&]() -> Status { return launch(*k, outs); };
  // Alternate which side goes first: whoever runs second finds warm caches and a busy device.
  const bool eager_first = k->probe.left.load(std::memory_order_relaxed) % 2 == 0;
  Result<double> te = Status::error(Code::kInvalid, "not run"), ts = te;
  if (eager_first) te = timed(eager_fn);
  ts = timed(served_fn);
  if (!eager_first) te = timed(eager_fn);
  KernelTable& table = State::get().table();
  if (!ts) return table.disable(key_, ts.status().to_string());
  probe_ran_ = true;
  if (!te) return;   // eager's own error goes to the caller as always; nothing to compare
  ProbeVerdict v = add_probe_pair(k->probe, {ts.value(), te.value(), !eager_first});
  if (!v.done || v.keep) return;
  State::get().counters(op_).demoted.fetch_add(1, std::memory_order_relaxed);
  char why[160];
  std::snprintf(why, sizeof why,
                "%.2fx eager's speed over %zu timed calls in this process: not faster than eager here in both orders",
                v.speedup, v.pairs);
  table.demote(key_, why);
}

namespace {
void add_check_time(OpCounters& c, std::chrono::steady_clock::time_point t0) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  c.shadow_us.fetch_add(static_cast<uint64_t>(us.count()), std::memory_order_relaxed);
}
}  // namespace

bool Call::shadow(std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& eager_outs,
                  std::chrono::steady_clock::time_point t0) {
  std::shared_ptr<LoadedKernel> k = std::move(checking_);
  OpCounters& c = State::get().counters(op_);
  struct Timed {   // on every way out
    OpCounters& c;
    std::chrono::steady_clock::time_point t0;
    ~Timed() { add_check_time(c, t0); }
  } timed{c, t0};
  Status s = Status::ok();
  try {   // eager's result is in hand: an allocation failure here must not reach the caller
    s = launch(*k, outs);
  } catch (const std::exception& e) {
    s = Status::error(Code::kLaunchError, std::string("live check: ") + e.what());
  }
  if (!s) {
    State::get().table().disable(key_, s.to_string());
    c.fallbacks.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const bool match = judge_shadow(*k, outs, eager_outs);
  (match ? c.hits : c.fallbacks).fetch_add(1, std::memory_order_relaxed);
  return match;
}

void Call::check_probe(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& eager_outs) {
  std::shared_ptr<LoadedKernel> k = std::move(checking_);
  if (!probe_ran_) return;   // the probe's kernel side did not run or failed: nothing to compare
  OpCounters& c = State::get().counters(op_);
  c.shadow_checks.fetch_add(1, std::memory_order_relaxed);
  const auto t0 = std::chrono::steady_clock::now();
  judge_shadow(*k, outs, eager_outs);   // the probe ran eager already: only the comparison is extra
  add_check_time(c, t0);
}

bool Call::judge_shadow(const LoadedKernel& k, const std::vector<at::Tensor>& outs,
                        const std::vector<at::Tensor>& eager_outs) {
  State& st = State::get();
  ShadowVerdict v;
  try {
    v = compare_outputs(outs, eager_outs, *k.record, st.table().dir());
  } catch (const std::exception& e) {
    // Not checked (e.g. no memory for the comparison): eager's result is the one known to be right.
    log_once(LogLevel::kWarn, "shadow-error:" + key_, std::string("live check could not compare (") + e.what() +
                                                           "); eager answered this call of " + key_);
    return false;
  }
  if (v.match) return true;
  st.counters(op_).shadow_mismatches.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> names(tnames_.begin(), tnames_.begin() + nt_);
  std::vector<const at::Tensor*> in(tensors_.begin(), tensors_.begin() + nt_);
  nlohmann::json evidence = {{"by", "live check"}, {"pid", static_cast<int64_t>(getpid())},
                             {"at_unix_s", static_cast<int64_t>(std::time(nullptr))},
                             {"served_calls", k.served_calls.load(std::memory_order_relaxed)},
                             {"outputs", v.to_json()}};
  try {
    evidence["inputs"] = summarize_inputs(names, in);
  } catch (const std::exception& e) {
    evidence["inputs"] = std::string("not summarised: ") + e.what();
  }
  char why[256];
  std::snprintf(why, sizeof why, "live check: out%d differs from eager (%s: error %.3g, budget %.3g, at flat index %lld: "
                "eager %.9g, kernel %.9g); disabling it in the cache",
                v.output, v.check.c_str(), v.error, v.budget, static_cast<long long>(v.index), v.expected, v.actual);
  st.table().disable(key_, why);   // this process: at once, and logged once
  if (!st.config().cache_readonly) disable_in_cache(st.table().dir(), k.record, std::move(evidence));
  return false;
}

Status Call::launch(LoadedKernel& k, std::vector<at::Tensor>& outs) {
  const at::Tensor& lead = *tensors_[0];
  outs.reserve(k.outputs.size());
  std::array<void*, 16> ptrs{};
  const int nslots = k.spec.num_slots();
  if (nslots > static_cast<int>(ptrs.size()) || nt_ + static_cast<int>(k.outputs.size()) != k.spec.num_tensor_slots)
    return Status::error(Code::kInvalid, "kernel's slots do not match the call");
  int slot = 0;
  for (int j = 0; j < nt_; ++j) ptrs[slot++] = tensors_[j]->defined() ? tensors_[j]->data_ptr() : nullptr;
  // Nothing runs on pointers less aligned than the ones the kernel was verified with (a vector
  // load that assumes 16 bytes faults on 4): eager answers instead.
  auto aligned = [&](int j, const void* p) {
    return p == nullptr || j >= static_cast<int>(k.align.size()) || align_class(p) >= k.align[j];
  };
  for (int j = 0; j < nt_; ++j)
    if (!aligned(j, ptrs[j])) return Status::error(Code::kUnsupported, "input less aligned than verified");
  for (const TensorMeta& m : k.outputs) {
    if (!m.defined) {
      outs.emplace_back();
      ptrs[slot++] = nullptr;
      continue;
    }
    at::ScalarType st = at::kFloat;
    switch (m.dtype) {
      case DType::kF32: st = at::kFloat; break;
      case DType::kF64: st = at::kDouble; break;
      case DType::kF16: st = at::kHalf; break;
      case DType::kBF16: st = at::kBFloat16; break;
      case DType::kI64: st = at::kLong; break;
      case DType::kI32: st = at::kInt; break;
      default: return Status::error(Code::kUnsupported, "output dtype");
    }
    outs.push_back(at::empty_strided(m.sizes, m.strides, lead.options().dtype(st)));
    if (!aligned(slot, outs.back().data_ptr()))
      return Status::error(Code::kUnsupported, "output less aligned than verified");
    ptrs[slot++] = outs.back().data_ptr();
  }
  std::vector<at::Tensor> scratch;
  for (int64_t bytes : k.spec.scratch_bytes) {
    scratch.push_back(at::empty({bytes}, lead.options().dtype(at::kByte)));
    ptrs[slot++] = scratch.back().data_ptr();
  }
  ExecContext ctx;
  if (dev_ == Dev::kCuda) {
    if (!cuda_hooks().stream) return Status::error(Code::kUnavailable, "no CUDA stream hook");
    ctx.stream = cuda_hooks().stream(device_);
  } else {
    static const ParallelFor pf = [](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
      at::parallel_for(0, n, 1, fn);
    };
    ctx.parallel_for = pf;
  }
  return k.launcher->run(ptrs.data(), ctx);
}

}  // namespace kc::dispatch
