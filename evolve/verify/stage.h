// The verification gauntlet's vocabulary: which stage, what it concluded, in which mode. Enums
// inside the code; their names appear only in verdict JSON and on the command line.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace kc::evolve {

enum class StageId { kStatic, kCompile, kLoad, kNumerics, kTiming, kRecheck, kSandbox, kSanitizer };
enum class Outcome { kPassed, kRejected, kSkipped };
// search: static..recheck (the search's cheap verdict); full: and the sanitizers (promotion and
// `kernelcraft verify`); sanitize: static, compile, load, then the sanitizer alone on one input
// set (a crash's replay).
enum class Mode { kSearch, kFull, kSanitize };

const char* stage_name(StageId s);
std::optional<StageId> stage_from_name(std::string_view name);
const char* outcome_name(Outcome o);
std::optional<Outcome> outcome_from_name(std::string_view name);
const char* mode_name(Mode m);
std::optional<Mode> mode_from_name(std::string_view name);

// What one stage concluded about a candidate, with the evidence for it.
struct StageReport {
  StageId id = StageId::kStatic;
  Outcome outcome = Outcome::kPassed;
  std::string summary;                // one line
  nlohmann::json evidence = nlohmann::json::object();
  double millis = 0;

  nlohmann::json to_json() const;
  // A report as another process wrote it; an unknown stage or outcome reads as `dflt` rejected.
  static StageReport from_json(const nlohmann::json& j, StageId dflt);
};

}  // namespace kc::evolve
