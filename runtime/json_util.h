// Reading JSON and CBOR that came from disk (job files, bundles, records, search state): every
// parse is non-throwing and depth-bounded, and every field is read with its type and range checked,
// so a damaged or hostile file becomes a Status, never an exception or a stack overflow.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace kc {

// Deeper files are refused: nlohmann's CBOR reader recurses once per level, so a file of nested
// arrays would otherwise overflow the stack (no legitimate file of ours nests past ~10).
constexpr int kMaxJsonDepth = 64;

// CBOR bytes -> JSON (strict: no trailing bytes). kCorrupt for anything that is not CBOR or nests
// deeper than max_depth.
Result<nlohmann::json> parse_cbor(std::string_view bytes, int max_depth = kMaxJsonDepth);
// JSON text -> JSON, same rules (nlohmann's text parser is iterative; the depth bound keeps dump()
// and our own recursive readers safe).
Result<nlohmann::json> parse_json_text(std::string_view text, int max_depth = kMaxJsonDepth);

// Optional field `name` of object `j` into `out` (left unchanged when absent). kInvalid for a wrong
// type or a value outside [lo, hi]. Integers must be JSON integers; doubles accept any finite number.
template <class T>
Status read_field(const nlohmann::json& j, const char* name, T& out,
                  T lo = std::numeric_limits<T>::lowest(), T hi = std::numeric_limits<T>::max()) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return Status::ok();
  auto bad = [&](const char* what) { return Status::error(Code::kInvalid, std::string(name) + ": " + what); };
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return bad("not a boolean");
    out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      if (v > static_cast<uint64_t>(hi)) return bad("out of range");
      out = static_cast<T>(v);
    } else if (it->is_number_integer()) {
      const int64_t v = it->get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (v < 0) return bad("out of range");
        if (static_cast<uint64_t>(v) > static_cast<uint64_t>(hi) || static_cast<uint64_t>(v) < static_cast<uint64_t>(lo))
          return bad("out of range");
      } else if (v < static_cast<int64_t>(lo) || v > static_cast<int64_t>(hi)) {
        return bad("out of range");
      }
      out = static_cast<T>(v);
    } else {
      return bad("not an integer");
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return bad("not a number");
    const double v = it->get<double>();
    if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi))) return bad("out of range");
    out = static_cast<T>(v);
  } else {
    static_assert(std::is_same_v<T, std::string>, "read_field: bool, integers, floating point or string");
    if (!it->is_string()) return bad("not a string");
    out = it->get<std::string>();
  }
  return Status::ok();
}

}  // namespace kc
