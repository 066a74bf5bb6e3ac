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
// Optional (absent in records written before them; same format version, since older readers
// ignore fields they do not know and newer ones read an absent field as "unknown"):
//   determinism string   "bitwise" (repeated calls gave identical bits in the gauntlet) |
//                        "varies" (they did not) | "unknown" (never observed: hand-made records)
//   budget      array    per output, the largest error against eager's output that the live check
//                        (dispatcher/shadow.h) accepts, in the gauntlet's mixed measure; empty
//                        when the gauntlet never ran (the live check then uses budget_fallback)
//   meta.disabled        for state "disabled": why, when, by whom, and the evidence (the outputs'
//                        error and a summary of the inputs that showed it)
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/backend.h"
#include "runtime/status.h"
#include "runtime/tensor_meta.h"

namespace kc {

constexpr int kRecordFormat = 1;

// What the gauntlet saw of a kernel's repeated calls on the same inputs. The serving path acts on
// it (torch.use_deterministic_algorithms, deterministic_only), so it is a field of its own rather
// than a value inside meta's evidence.
enum class Determinism { kUnknown, kBitwise, kVaries };
const char* determinism_name(Determinism d);                       // "unknown" | "bitwise" | "varies"
std::optional<Determinism> determinism_from(std::string_view name);  // nullopt for anything else

// What the server does with a record (the schema's `state`).
enum class RecordState { kServed, kEagerBest, kDisabled };
const char* state_name(RecordState s);                            // "served" | "eager_best" | "disabled"
std::optional<RecordState> state_from(std::string_view name);     // nullopt for anything else

struct Record {
  int format = kRecordFormat;
  std::string key, op;
  BackendKind backend = BackendKind::kCpu;
  RecordState state = RecordState::kServed;
  std::string source;
  nlohmann::json launch = nlohmann::json::object();
  nlohmann::json meta = nlohmann::json::object();
  std::string blob;
  Determinism determinism = Determinism::kUnknown;
  std::vector<double> budget;   // per output; empty: not measured
};

// The live check's allowed error for output `j` of dtype `dtype`: the record's budget, never below
// a floor of 16 units of the dtype's roundoff; budget_fallback when the record has none.
double live_budget(const Record& r, size_t j, DType dtype);
// The allowed error for records without a measured budget (hand-made ones): room for a different
// summation order or formula, far below what a wrong kernel shows.
double budget_fallback(DType dtype);

std::string encode_record(const Record& r);
// kCorrupt for bytes that do not decode or miss fields; kUnsupported for another format version.
Result<Record> decode_record(const std::string& bytes);
// True when the record passed the verification gauntlet (meta.provenance.verified): evolved records
// and `cache put --verify`; false for hand-stored ones and records without provenance.
bool record_verified(const Record& r);
// False when its verification was done elsewhere and kept on another's word (a signed bundle, a
// peer of a distributed job: meta.provenance.verified_here == false, bundle.h); the serving path
// then live-checks its first calls in every process even with shadow_calls at 0.
bool record_verified_here(const Record& r);
// The record as JSON for display: blob replaced by {"bytes": n, "fnv1a64": "..."}.
nlohmann::json record_summary(const Record& r);

}  // namespace kc
