// Bundles: a cache (or part of it) in one file, for shipping pre-warmed kernels to deployments.
//
// Bundle format (version 1): one CBOR map, written to a temporary file and renamed into place.
//   magic     string  "kernelcraft-bundle"
//   version   int     kBundleVersion
//   created   int     unix time of the export
//   count     int     number of entries
//   records   array   of {"key": string, "value": byte string (an encoded record, record.h)}
// Entries carry the encoded record bytes unchanged, so a bundle round-trips the store exactly and
// each record is validated on import by the same decode_record the server uses.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "kernel_cache/store.h"
#include "runtime/status.h"

namespace kc {

constexpr int kBundleVersion = 1;

// Which records to export; empty fields match everything.
struct BundleFilter {
  std::string key_contains;  // substring of the key
  std::string op;            // aten name ("aten::gelu") or short name ("gelu")
};

struct ExportStats {
  size_t exported = 0;
  size_t skipped = 0;                // stored values that do not decode (left out, listed)
  size_t damaged = 0;                // damaged regions of the database skipped (their keys are lost)
  size_t bytes = 0;                  // size of the bundle file
  std::vector<std::string> errors;   // "<key>: <why>" per skipped value
};

// Writes every matching record of `store` (any mode) to `path` atomically.
Result<ExportStats> export_bundle(Store& store, const std::string& path, const BundleFilter& filter = {});

struct ImportOptions {
  bool overwrite = true;    // replace records already stored under the same key
  bool dry_run = false;     // validate and count only
};

struct ImportStats {
  size_t imported = 0;
  size_t unchanged = 0;              // identical bytes already stored
  size_t kept = 0;                   // a different record stored and overwrite == false
  size_t rejected = 0;               // entries that do not decode or whose key does not match
  std::vector<std::string> errors;   // "<key>: <why>" per rejected entry
};

// Reads `path` and stores its valid records (store must be a kWriter unless dry_run). A file that
// is not a bundle is kCorrupt; another bundle version kUnsupported; bad entries are counted, not fatal.
Result<ImportStats> import_bundle(Store& store, const std::string& path, const ImportOptions& opts = {});

}  // namespace kc
