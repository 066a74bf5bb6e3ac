// The in-memory table in front of the store: key -> loaded kernel, "absent", "eager is best" or
// "disabled". The hot path is one shared-lock hash lookup; the store is consulted on first sight
// of a key and again only after a catch-up with writers (at most every catch_up_ms). Opening the
// store and catching up run on a thread of the table's own; a caller waits for them at most
// `store_wait_ms` and otherwise carries on with what the table already has. While it serves
// kernels, that thread also catches up every catch_up_ms by itself and revokes kernels whose record
// was removed or changed, so removal reaches a process that only hits; a hit reads one atomic more.
// A table belongs to the process that made it: after fork() the owner abandons it and makes a new
// one (dispatcher/state.cpp; runtime/fork.h says why).
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/backend.h"
#include "runtime/tensor_meta.h"

namespace kc {

// One timed pair of serve-probe calls (dispatcher/probe.h).
struct ProbeSample {
  double served_ms = 0, eager_ms = 0;
  bool served_first = false;            // the kernel ran first (so eager found the inputs in cache)
};

// The first calls of a kernel served in this process run eager too, both timed where the user's
// program runs (dispatcher/probe.h): a verdict measured in the worker, at another time and under
// other load, is not proof that the kernel is faster here.
struct ServeProbe {
  std::atomic<int> left{0};             // probe calls still to make; 0: serve without probing
  std::mutex mu;                        // guards the samples (probe calls only, never a plain hit)
  std::vector<ProbeSample> samples;
};

// A kernel ready to launch for one key.
struct LoadedKernel {
  std::string key;
  std::shared_ptr<const Record> record;
  ResolvedSpec spec;
  std::vector<TensorMeta> outputs;      // output metadata, captured from eager when loaded
  std::vector<int> align;               // per tensor (inputs, then outputs): the class it was verified at
  std::unique_ptr<Launcher> launcher;
  ServeProbe probe;
  // The live check (dispatcher/shadow.h): this process's served calls of the key so far, and a
  // per-key salt for the sampled ones.
  std::atomic<uint64_t> served_calls{0};
  uint64_t salt = 0;
  // record->determinism == kBitwise, read on every hit while determinism is required.
  bool bitwise_deterministic = false;
  // record_verified_here(*record): when false its first calls are live-checked whatever
  // shadow_calls says (State::shadow_calls_not_verified_here).
  bool verified_here = true;
};

class KernelTable {
 public:
  enum class Kind { kServe, kMiss, kEagerBest, kLoad, kDisabled };
  struct Lookup {
    Kind kind = Kind::kMiss;
    std::shared_ptr<LoadedKernel> kernel;         // kServe
    std::shared_ptr<const Record> record;         // kLoad: a served record not yet loaded
    bool first_miss = false;                      // kMiss: first time this key missed here
  };

  // Opens the store (called on the table's store thread); tests substitute a slow or failing one.
  using StoreOpener = std::function<Result<std::unique_ptr<Store>>()>;

  // dir: cache directory; readonly: open with OpenForReadOnly instead of as a secondary.
  KernelTable(std::string dir, bool readonly, int catch_up_ms, int store_wait_ms = 2000,
              StoreOpener opener = {});
  ~KernelTable();
  KernelTable(const KernelTable&) = delete;
  KernelTable& operator=(const KernelTable&) = delete;

  Lookup find(const std::string& key);
  void install(std::shared_ptr<LoadedKernel> k);
  // Never launch `key` again in this process (a failed load or launch); logs one line.
  void disable(const std::string& key, const std::string& why);
  // Serve eager for `key` for the rest of this process, as if the record were eager_best (a kernel
  // that proved slower than eager here); logs one line.
  void demote(const std::string& key, const std::string& why);
  // A kLoad lookup whose caller will not load it now (a composite's readiness check, a call being
  // captured): `record` is kept, and the next find of `key` returns kLoad with it again from
  // memory. Forgetting instead would reread the store and catch up with its writers on every call.
  void defer_load(const std::string& key, std::shared_ptr<const Record> record);
  // Forget everything cached in memory for `key` (e.g. after a put from this process).
  void forget(const std::string& key);
  void forget_all();

  // "not opened", "open", "missing", "unavailable: <why>" (for status()).
  std::string store_state() const;
  // Stops the store thread (waiting for it at most a second); lookups after this never refresh.
  // For a table that is being replaced but may still be in use by calls in flight.
  void retire();
  const std::string& dir() const { return dir_; }
  size_t loaded_count() const;

 private:
  struct Entry {
    Kind kind;
    uint64_t gen;
    std::shared_ptr<LoadedKernel> kernel;
    std::shared_ptr<const Record> deferred;   // kLoad put back by defer_load: nobody is loading it
  };
  Lookup claim_deferred(const std::string& key);
  struct StoreThread;   // kernel_table.cpp; shared with the thread so that it may outlive the table
  Lookup consult_store(const std::string& key);
  void drop_revoked();                         // erases served entries the store thread revoked
  void unwatch(const std::string* key);        // stops rechecking key (all keys when null)
  void maybe_catch_up();
  void refresh();        // asks the store thread to open or catch up; waits at most store_wait_

  std::string dir_;
  bool readonly_;
  std::chrono::milliseconds catch_up_every_;
  std::chrono::milliseconds store_wait_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::atomic<int64_t> next_catch_up_{0};   // steady_clock ticks; 0: due now

  std::mutex due_mu_;                  // guards last_try_ and tried_ (held only to read the clock)
  std::chrono::steady_clock::time_point last_try_{};
  bool tried_ = false;

  std::shared_ptr<StoreThread> store_;
  StoreOpener opener_;
  std::thread thread_;                 // started by the first refresh; guarded by store_->mu
};

}  // namespace kc
