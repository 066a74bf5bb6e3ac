// The static source check of the verification gauntlet: a table of rules over a candidate's device
// code (CUDA or CPU) that rejects what no test input can reliably expose (mutable state surviving
// launches, clocks, L2 residency tricks, precision the policy forbids, host calls) and records what
// deserves a look (inline asm, 32-bit index math on small keys). Torch-free; docs/DEFECTS.md names
// the classes (Dxx) each rule stands for.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

struct Finding {
  std::string rule;       // rule id from the table in static_check.cpp, e.g. "device-state"
  std::string severity;   // "error" rejects the candidate, "warning" is recorded
  int line = 0;           // 1-based line of the original source
  std::string text;       // the offending source line, trimmed
  std::string why;        // one sentence, with the DEFECTS.md class
};

struct StaticReport {
  std::vector<Finding> findings;
  bool ok() const;                  // no errors
  std::string first_error() const;  // "rule at line N: text" of the first error, or ""
  nlohmann::json to_json() const;   // {"ok": bool, "errors": n, "warnings": n, "findings": [...]}
};

// policy "fp32" | "tf32" | "bf16"; dtypes: the dtypes of the call's
// tensors (e.g. {"f32"}); max_numel: the largest tensor numel of the call (for the int32-index
// rule). Comments and string literals are stripped before matching, except the strings that
// carry code: inline asm operands, __attribute__ and _Pragma arguments, preprocessor lines.
StaticReport static_check(const std::string& source, BackendKind backend, const std::string& policy,
                          const std::vector<std::string>& dtypes, int64_t max_numel);

// The same for a call: backend, policy, dtypes and the largest numel taken from `c`.
StaticReport static_check(const std::string& source, const OpCall& c);

}  // namespace kc::evolve
