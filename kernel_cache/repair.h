// `kernelcraft cache repair`: salvage a damaged cache without ever making it worse. The database's
// files are copied aside first. A database that cannot be opened goes through RocksDB's own repair;
// then every readable entry is kept (damaged blocks are read around, and the database is rebuilt
// from what was read), and records that no longer decode are dropped (they could never be
// served). Counts say what happened.
#pragma once
#include <cstddef>
#include <string>

#include "runtime/status.h"

namespace kc {

struct RepairReport {
  std::string backup_dir;     // a copy of the database files as they were before the repair
  size_t records = 0;         // records readable after the repair (kept)
  size_t dropped = 0;         // entries that survived RocksDB's repair but do not decode (removed)
  size_t other = 0;           // non-record entries kept (search state)
  size_t damaged = 0;         // damaged regions read around (their keys are lost); then rebuilt
  bool rocksdb_repair = false; // RocksDB's RepairDB ran (the database could not be opened)
};

// Repairs the cache in `dir`. kNotFound if it holds no database files; kBusy if a writer has it open.
Result<RepairReport> repair_cache(const std::string& dir);

}  // namespace kc
