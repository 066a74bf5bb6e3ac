// The in-memory table in front of the store: key -> loaded kernel, "absent", "eager is best" or
// "disabled". The hot path is one shared-lock hash lookup; the store is consulted on first sight
// of a key and again only after a catch-up with writers (at most every catch_up_ms).
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/backend.h"
#include "runtime/tensor_meta.h"

namespace kc {

// A kernel ready to launch for one key.
struct LoadedKernel {
  std::string key;
  std::shared_ptr<const Record> record;
  ResolvedSpec spec;
  std::vector<TensorMeta> outputs;      // output metadata, captured from eager when loaded
  std::unique_ptr<Launcher> launcher;
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

  // dir: cache directory; readonly: open with OpenForReadOnly instead of as a secondary.
  KernelTable(std::string dir, bool readonly, int catch_up_ms);

  Lookup find(const std::string& key);
  void install(std::shared_ptr<LoadedKernel> k);
  // Never launch `key` again in this process (a failed load or launch); logs one line.
  void disable(const std::string& key, const std::string& why);
  // Forget everything cached in memory for `key` (e.g. after a put from this process).
  void forget(const std::string& key);
  void forget_all();

  // "open", "missing", "unavailable: <why>" (for status()).
  std::string store_state() const;
  const std::string& dir() const { return dir_; }
  size_t loaded_count() const;

 private:
  struct Entry {
    Kind kind;
    uint64_t gen;
    std::shared_ptr<LoadedKernel> kernel;
  };
  Lookup consult_store(const std::string& key);
  void maybe_catch_up();

  std::string dir_;
  bool readonly_;
  std::chrono::milliseconds catch_up_every_;
  mutable std::shared_mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::atomic<uint64_t> gen_{1};
  std::atomic<int64_t> next_catch_up_{0};   // steady_clock ticks; 0: due now

  mutable std::mutex store_mu_;        // guards store_, store_state_, last_try_
  std::unique_ptr<Store> store_;
  std::string store_state_ = "not opened";
  std::chrono::steady_clock::time_point last_try_{};
  bool tried_ = false;
};

}  // namespace kc
