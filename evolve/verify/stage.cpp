// Names of the gauntlet's stages, outcomes and modes (the JSON and CLI spelling).
#include "evolve/verify/stage.h"

#include <array>

namespace kc::evolve {
namespace {

constexpr std::array<const char*, 8> kStages = {"static", "compile", "load", "numerics",
                                                "timing", "recheck", "sandbox", "sanitizer"};
constexpr std::array<const char*, 3> kOutcomes = {"passed", "rejected", "skipped"};
constexpr std::array<const char*, 3> kModes = {"search", "full", "sanitize"};

template <class E, size_t N> std::optional<E> from_name(const std::array<const char*, N>& names, std::string_view n) {
  for (size_t k = 0; k < N; ++k)
    if (n == names[k]) return static_cast<E>(k);
  return std::nullopt;
}

}  // namespace

const char* stage_name(StageId s) { return kStages.at(static_cast<size_t>(s)); }
std::optional<StageId> stage_from_name(std::string_view n) { return from_name<StageId>(kStages, n); }
const char* outcome_name(Outcome o) { return kOutcomes.at(static_cast<size_t>(o)); }
std::optional<Outcome> outcome_from_name(std::string_view n) { return from_name<Outcome>(kOutcomes, n); }
const char* mode_name(Mode m) { return kModes.at(static_cast<size_t>(m)); }
std::optional<Mode> mode_from_name(std::string_view n) { return from_name<Mode>(kModes, n); }

nlohmann::json StageReport::to_json() const {
  return {{"name", stage_name(id)}, {"outcome", outcome_name(outcome)}, {"summary", summary},
          {"evidence", evidence}, {"millis", millis}};
}

StageReport StageReport::from_json(const nlohmann::json& j, StageId dflt) {
  StageReport s;
  s.id = stage_from_name(j.value("name", "")).value_or(dflt);
  s.outcome = outcome_from_name(j.value("outcome", "")).value_or(Outcome::kRejected);
  s.summary = j.value("summary", "");
  s.evidence = j.value("evidence", nlohmann::json::object());
  s.millis = j.value("millis", 0.0);
  return s;
}

}  // namespace kc::evolve
