// Cache records <-> CBOR bytes, with every field checked on the way in: a stored record is
// untrusted input (another version, a torn write, a hand-edited bundle) and must never be served
// half-parsed.
#include "kernel_cache/record.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "runtime/json_util.h"
#include "runtime/fsutil.h"

namespace kc {
namespace {

using nlohmann::json;

Status corrupt(const std::string& why) { return Status::error(Code::kCorrupt, "cache record: " + why); }

Status need_string(const json& j, const char* field, std::string& out) {
  auto it = j.find(field);
  if (it == j.end()) return corrupt(std::string("missing field '") + field + "'");
  if (!it->is_string()) return corrupt(std::string("field '") + field + "' is not a string");
  out = it->get<std::string>();
  return Status::ok();
}

Status need_object(const json& j, const char* field, json& out) {
  auto it = j.find(field);
  if (it == j.end()) return corrupt(std::string("missing field '") + field + "'");
  if (!it->is_object()) return corrupt(std::string("field '") + field + "' is not an object");
  out = *it;
  return Status::ok();
}


Result<Record> decode_object(const json& j) {
  if (!j.is_object()) return corrupt("not a CBOR map");
  auto f = j.find("format");
  if (f == j.end()) return corrupt("missing field 'format'");
  if (!f->is_number_integer()) return corrupt("field 'format' is not an integer");
  // The version is checked before anything else: another format may lay out its fields differently.
  if (f->get<int64_t>() != kRecordFormat)
    return Status::error(Code::kUnsupported, "cache record format " + std::to_string(f->get<int64_t>()) +
                                                 " (this build reads format " +
                                                 std::to_string(kRecordFormat) + ")");
  Record r;
  KC_RETURN_IF_ERROR(need_string(j, "key", r.key));
  KC_RETURN_IF_ERROR(need_string(j, "op", r.op));
  std::string backend;
  KC_RETURN_IF_ERROR(need_string(j, "backend", backend));
  auto kind = backend_from_name(backend);
  if (!kind) return Status::error(Code::kCorrupt, "record: unknown backend '" + backend + "'");
  r.backend = *kind;
  std::string state;
  KC_RETURN_IF_ERROR(need_string(j, "state", state));
  KC_RETURN_IF_ERROR(need_string(j, "source", r.source));
  KC_RETURN_IF_ERROR(need_object(j, "launch", r.launch));
  KC_RETURN_IF_ERROR(need_object(j, "meta", r.meta));
  // An unknown state must not be mistaken for "served": the server launches only what it knows.
  auto known = state_from(state);
  if (!known) return corrupt("unknown state '" + state + "'");
  r.state = *known;
  if (r.key.empty()) return corrupt("empty key");
  auto b = j.find("blob");
  if (b == j.end()) return corrupt("missing field 'blob'");
  if (!b->is_binary()) return corrupt("field 'blob' is not a byte string");
  const auto& bin = b->get_binary();
  r.blob.assign(reinterpret_cast<const char*>(bin.data()), bin.size());
  // Optional fields (record.h): absent reads as unknown / not measured; present but wrong is corrupt,
  // since the serving path decides on them.
  if (auto d = j.find("determinism"); d != j.end()) {
    auto v = d->is_string() ? determinism_from(d->get<std::string>()) : std::nullopt;
    if (!v) return corrupt("field 'determinism' is not bitwise, varies or unknown");
    r.determinism = *v;
  }
  if (auto bu = j.find("budget"); bu != j.end()) {
    if (!bu->is_array()) return corrupt("field 'budget' is not an array");
    for (const auto& x : *bu) {
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0)
        return corrupt("field 'budget' holds something other than finite non-negative numbers");
      r.budget.push_back(x.get<double>());
    }
  }
  return r;
}

}  // namespace

// Every field but the blob, as stored and as shown.
json fields_without_blob(const Record& r) {
  json j = json::object();
  j["format"] = r.format;
  j["key"] = r.key;
  j["op"] = r.op;
  j["backend"] = backend_name(r.backend);
  j["state"] = state_name(r.state);
  j["source"] = r.source;
  j["launch"] = r.launch;
  j["meta"] = r.meta;
  j["determinism"] = determinism_name(r.determinism);
  j["budget"] = r.budget;
  return j;
}

std::string encode_record(const Record& r) {
  json j = fields_without_blob(r);
  // launch and meta are objects by contract; anything else is stored as an empty object so the
  // record stays decodable (decode_record rejects non-objects).
  j["launch"] = r.launch.is_object() ? r.launch : json::object();
  j["meta"] = r.meta.is_object() ? r.meta : json::object();
  j["blob"] = json::binary(json::binary_t::container_type(r.blob.begin(), r.blob.end()));
  std::string out;
  // to_cbor does not throw for values a json can hold; should that ever change, an empty value is
  // what gets stored, and decode_record reports it as corrupt instead of the writer crashing.
  try {
    json::to_cbor(j, out);
  } catch (const std::exception&) {
    out.clear();
  }
  return out;
}

Result<Record> decode_record(const std::string& bytes) {
  if (bytes.empty()) return corrupt("empty value");
  try {
    // strict: trailing bytes after the map mean a torn or concatenated value, not a record. Depth-
    // bounded: records come from other processes' writes and from bundles.
    auto j = parse_cbor(bytes);
    if (!j) return corrupt("bytes do not decode as CBOR: " + j.status().message());
    return decode_object(j.value());
  } catch (const std::exception& e) {
    return corrupt(std::string("decode failed: ") + e.what());
  }
}

bool record_verified(const Record& r) {
  auto p = r.meta.find("provenance");
  if (p == r.meta.end() || !p->is_object()) return false;
  auto v = p->find("verified");
  return v != p->end() && v->is_boolean() && v->get<bool>();
}

bool record_verified_here(const Record& r) {
  auto p = r.meta.find("provenance");
  if (p == r.meta.end() || !p->is_object()) return true;
  auto v = p->find("verified_here");
  return v == p->end() || !v->is_boolean() || v->get<bool>();
}

const char* determinism_name(Determinism d) {
  switch (d) {
    case Determinism::kBitwise: return "bitwise";
    case Determinism::kVaries: return "varies";
    case Determinism::kUnknown: break;
  }
  return "unknown";
}

const char* state_name(RecordState s) {
  switch (s) {
    case RecordState::kServed: return "served";
    case RecordState::kEagerBest: return "eager_best";
    case RecordState::kDisabled: return "disabled";
  }
  return "disabled";
}

std::optional<RecordState> state_from(std::string_view name) {
  if (name == "served") return RecordState::kServed;
  if (name == "eager_best") return RecordState::kEagerBest;
  if (name == "disabled") return RecordState::kDisabled;
  return std::nullopt;
}

std::optional<Determinism> determinism_from(std::string_view name) {
  if (name == "bitwise") return Determinism::kBitwise;
  if (name == "varies") return Determinism::kVaries;
  if (name == "unknown") return Determinism::kUnknown;
  return std::nullopt;
}

namespace {

// Unit roundoff-sized spacing per dtype, as the gauntlet's floor uses it (16 of them).
double dtype_eps(DType d) {
  switch (d) {
    case DType::kF64: return 2.2e-16;
    case DType::kF32: return 1.19e-7;
    case DType::kF16: return 9.8e-4;
    case DType::kBF16: return 7.8e-3;
    default: return 0;   // integer and boolean outputs: exact
  }
}

}  // namespace

double budget_fallback(DType d) {
  // fp32: about 840 ulp in the mixed measure, which holds blocked vs sequential sums of rows of
  // 10^5 or so; a kernel that is wrong is off by far more than that.
  switch (d) {
    case DType::kF64: return 1e-9;
    case DType::kF32: return 1e-4;
    case DType::kF16: return 2e-2;
    case DType::kBF16: return 1e-1;
    default: return 0;
  }
}

double live_budget(const Record& r, size_t j, DType dtype) {
  if (j >= r.budget.size()) return budget_fallback(dtype);
  return std::max(r.budget[j], 16 * dtype_eps(dtype));
}

json record_summary(const Record& r) {
  json j = fields_without_blob(r);
  j["blob"] = {{"bytes", r.blob.size()}, {"fnv1a64", fnv1a64_hex(r.blob)}};
  return j;
}

}  // namespace kc
