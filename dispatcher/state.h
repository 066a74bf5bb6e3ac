// The serving state of this process: configuration, per-op switches and counters, the kernel table,
// the backends' target strings, and the record of missed keys. One instance per process.
#pragma once
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernel_cache/kernel_table.h"
#include "runtime/config.h"
#include "runtime/fork.h"
#include "runtime/ops.h"

namespace kc::dispatch {

using Dev = BackendKind;   // the backend key a call arrived at

struct OpCounters {
  std::atomic<uint64_t> hits{0};        // served by a cached kernel
  std::atomic<uint64_t> misses{0};      // no kernel for the key: eager
  std::atomic<uint64_t> fallbacks{0};   // a kernel exists but eager ran (loading, disabled, failed)
  std::atomic<uint64_t> probes{0};      // served kernel and eager both ran, timed (dispatcher/probe.h)
  std::atomic<uint64_t> demoted{0};     // keys demoted to eager here: slower than eager in this process
  std::atomic<uint64_t> shadow_checks{0};      // served calls compared with eager (dispatcher/shadow.h)
  std::atomic<uint64_t> shadow_mismatches{0};  // ... that differed: the key was disabled everywhere
  std::atomic<uint64_t> shadow_us{0};          // wall time those checks added (extra eager + comparison)
  std::atomic<uint64_t> nondeterministic{0};   // eager because determinism was required and the
                                               // kernel was not recorded bitwise deterministic
};

class State {
 public:
  static State& get();

  bool on(OpId op) const { return enabled_[static_cast<int>(op)].load(std::memory_order_relaxed); }
  void set_on(OpId op, bool v) { enabled_[static_cast<int>(op)].store(v); }
  bool registered(OpId op) const { return registered_[static_cast<int>(op)].load(); }
  void set_registered(OpId op) { registered_[static_cast<int>(op)].store(true); }
  OpCounters& counters(OpId op) { return counters_[static_cast<int>(op)]; }
  void reset_counters();

  KernelTable& table();
  const char* policy() const { return policy_.load(std::memory_order_relaxed); }
  // Hot-path copies of settings, kept current by configure(): the live check's plan (both 0 with
  // cache_readonly, which benchmarks and shipped caches use and which could not record a disable)
  // and deterministic_only.
  int shadow_calls() const { return shadow_calls_.load(std::memory_order_relaxed); }
  int shadow_every() const { return shadow_every_.load(std::memory_order_relaxed); }
  // The first calls checked for a record verified elsewhere (record_verified_here false): at least
  // kChecksNotVerifiedHere, 0 with cache_readonly.
  int shadow_calls_not_verified_here() const { return shadow_calls_elsewhere_.load(std::memory_order_relaxed); }
  static constexpr int kChecksNotVerifiedHere = 4;
  // Only bitwise-deterministic kernels may be served: deterministic_only, or PyTorch's own switch
  // (torch.use_deterministic_algorithms) as it is at this call.
  bool determinism_required() const;
  // The target string keys are built with: cpu_backend().target_id() or the CUDA device's.
  const std::string& target(Dev dev, int device);

  // First miss of a key in this process: remembered (bounded) and appended to the miss log.
  void record_miss(const std::string& key);
  std::vector<std::string> missed_keys() const;

  Config config() const;
  // Applies a JSON config at run time: switches, cache dir (reopens the table), miss log, ...
  Status configure(const nlohmann::json& j);
  nlohmann::json status_json();
  // Process exit (an atexit handler of the library): stops this process's store thread, waiting
  // for it at most a second, so that no thread of ours is inside RocksDB while the process's
  // static objects (RocksDB's among them) are destroyed. Calls after this still run; the table
  // no longer refreshes.
  void shut_down();

 private:
  // What is guarded by a mutex, one per process (runtime/fork.h): a fork()ed child gets a fresh
  // mutex, no table (it opens its own store and starts its own store thread) and no missed keys.
  struct PerProcess {
    std::mutex mu;                              // guards the writes below
    std::atomic<KernelTable*> table{nullptr};   // replaced tables are leaked: calls may hold them
    std::vector<std::string> missed;
    std::unordered_set<std::string> missed_set;
    std::mutex target_mu;                       // serialises computing targets_
  };
  State();
  void apply_switches(const Config& c);   // op switches and the hot-path copies above

  mutable PerFork<PerProcess> proc_;
  // Immutable once published, and leaked when replaced (configure() is rare): readers copy it
  // without a lock, so a child reads its parent's configuration whatever the parent's threads held.
  std::atomic<const Config*> cfg_{nullptr};
  std::atomic<const char*> policy_{"fp32"};   // points at a string literal
  std::atomic<int> shadow_calls_{0}, shadow_every_{0}, shadow_calls_elsewhere_{0};
  std::atomic<bool> deterministic_only_{false};
  std::array<std::atomic<bool>, kNumOps> enabled_{};
  std::array<std::atomic<bool>, kNumOps> registered_{};
  std::array<OpCounters, kNumOps> counters_{};
  // Computed once each (leaked strings), so the hot path takes no lock; [0] is the CPU's, [1 + d]
  // CUDA device d's; devices past kMaxDevices never serve.
  static constexpr int kMaxDevices = 64;
  std::array<std::atomic<const std::string*>, kMaxDevices + 1> targets_{};
};

// Registers the interception kernels for every op in `ops` not yet registered (CPU, and CUDA when
// built with it). Safe to call again with more ops.
void register_ops(const std::vector<std::string>& ops);

}  // namespace kc::dispatch
