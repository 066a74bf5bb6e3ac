// The RocksDB store: one database per cache directory, records keyed by cache key.
//
// Who writes: only one process may open a RocksDB read-write, so writers (the CLI, the evolution
// worker, an explicit put from a user process) open it briefly as kWriter, retrying while another
// writer holds the lock, and close it again. Serving processes open it as kReader: a RocksDB
// secondary instance that sees later writes after catch_up(). kReadOnly serves a shipped cache
// from a directory that may be read-only. Compression is off everywhere: inside a CUDA-initialised
// torch process RocksDB's compressed flush crashed on the H200 (docs/GPU_MACHINE.md), and
// records are small.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace kc {

class Store {
 public:
  enum class Mode { kReader, kWriter, kReadOnly };
  virtual ~Store() = default;

  // Opens (kWriter creates) the database in `dir`. A locked database makes kWriter retry for up to
  // `lock_wait_ms` before kBusy. A missing database is kNotFound for readers; a damaged one kCorrupt.
  static Result<std::unique_ptr<Store>> open(const std::string& dir, Mode mode, int lock_wait_ms = 5000);

  virtual Mode mode() const = 0;
  virtual const std::string& dir() const = 0;
  // kNotFound if absent.
  virtual Result<std::string> get(const std::string& key) = 0;
  // kWriter only; synced to disk before returning.
  virtual Status put(const std::string& key, const std::string& value) = 0;
  virtual Status remove(const std::string& key) = 0;
  // Visits keys starting with `prefix` in order until fn returns false. With `damaged` given, a
  // region that fails its checksum is skipped and counted there (the listing goes on after it; the
  // keys inside are lost to the scan) instead of ending the scan with kCorrupt.
  virtual Status scan(const std::string& prefix,
                      const std::function<bool(const std::string& key, const std::string& value)>& fn,
                      size_t* damaged = nullptr) = 0;
  // kReader: applies writes made by others since open (cheap when nothing changed). No-op otherwise.
  virtual Status catch_up() = 0;
  // The last write this view has seen (grows with every put or remove, ours or, after catch_up(),
  // others'); equal values mean nothing changed in between.
  virtual uint64_t sequence() const = 0;
};

// RocksDB's own repair of the database in `dir` (tables re-read, a new MANIFEST written): what can
// be read survives. Nobody else may have the database open. See kernel_cache/repair.h for the
// backup and record checks around it.
Status repair_database(const std::string& dir);
// True if `dir` holds RocksDB files (a MANIFEST, table files, write-ahead logs), CURRENT or not.
bool has_database_files(const std::string& dir);

// Constructs RocksDB's process-wide singletons now: its default Env (thread pools, file system),
// and the thread-local and compression caches that Env::Default() builds just before it. They are
// function-local statics, built on first use and destroyed in the reverse order of construction,
// so an exit hook registered before the first database was opened runs after they are gone.
// torch_ops/library.cpp calls this before registering the hook that stops the store thread.
void construct_rocksdb_singletons();

// The default cache directory: $KERNELCRAFT_CACHE_DIR, else $XDG_CACHE_HOME/kernelcraft, else
// ~/.cache/kernelcraft.
std::string default_cache_dir();

}  // namespace kc
