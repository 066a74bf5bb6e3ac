// The static check's rules (static_check_rules.cpp), one table: what each rule looks for, in
// which view of the source, for which backend, when it applies, and why. Internal to the check.
#pragma once
#include <cstddef>
#include <set>
#include <string>

namespace kc::evolve::rules {

enum class Back { kCuda, kCpu, kBoth };
// kCode: comments and the contents of string/char literals blanked. kQuoted: only preprocessor lines
// and the arguments of asm(...), __attribute__((...)) and _Pragma(...), with their strings intact
// (those strings are code: PTX, optimize("fast-math")).
enum class View { kCode, kQuoted };
// When a rule applies, from the call: float data is f32/f64 (or unknown); reduced precision is
// allowed where the data itself is f16/bf16 or the policy says so.
enum class When { kAlways, kFloatData, kNoFp16, kNoBf16, kNoTensorCore };
enum class Check { kRegex, kDeviceState, kInclude, kInt32Index };

struct Rule {
  const char* id;
  Back back;
  View view;
  Check check;
  const char* pattern;    // kRegex only
  const char* severity;   // kInt32Index decides per call
  When when;
  const char* why;
};

extern const Rule kRules[];
extern const size_t kNumRules;
// Headers a kernel may include, per backend (the "include" rule).
extern const std::set<std::string> kCpuIncludes;
extern const std::set<std::string> kCudaIncludes;

}  // namespace kc::evolve::rules
