// Cache records: JSON metadata plus a binary blob (shared object or CUBIN), stored as CBOR.
//
// Record schema (format 1), every field present in the encoded JSON:
//   format      int      record format version (kRecordFormat)
//   key         string   the cache key it was made for (kernel_cache/key.h)
//   op          string   aten operator
//   backend     string   "cpu" | "cuda"
//   state       string   "served" (launch it) | "eager_best" (searched, eager won: do not search
//                        again) | "disabled" (failed in the field: never launch)
//   source      string   kernel source (C++ or CUDA)
//   launch      object   launch spec (runtime/launch_spec.h)
//   meta        object   evidence, timings, knobs, lineage, provenance, compile log (free-form)
//   blob        binary   compiled binary for `key`'s target; empty for eager_best
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace kc {

constexpr int kRecordFormat = 1;

struct Record {
  int format = kRecordFormat;
  std::string key, op, backend;
  std::string state = "served";
  std::string source;
  nlohmann::json launch = nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::object();
  std::string blob;
};

std::string encode_record(const Record& r);
// kCorrupt for bytes that do not decode or miss fields; kUnsupported for another format version.
Result<Record> decode_record(const std::string& bytes);
// True when the record passed the verification gauntlet (meta.provenance.verified): evolved records
// and `cache put --verify`; false for hand-stored ones and records without provenance.
bool record_verified(const Record& r);
// The record as JSON for display: blob replaced by {"bytes": n, "fnv1a64": "..."}.
nlohmann::json record_summary(const Record& r);

}  // namespace kc
