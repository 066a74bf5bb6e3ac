// The verification gauntlet: the order of its stages (each in its stage_<name>.cpp; the list
// and rationale in gauntlet.h) and the loop over them. Setup and working state are
// gauntlet_setup.cpp and gauntlet_impl.h.
#include "evolve/verify/gauntlet.h"

#include "evolve/verify/gauntlet_impl.h"
#include "evolve/verify/gauntlet_run.h"
#include "evolve/verify/sandbox.h"

namespace kc::evolve {

const std::vector<const GauntletStage*>& gauntlet_stages() {
  static const std::vector<const GauntletStage*> stages = {&static_stage(),   &compile_stage(), &load_stage(),
                                                           &numerics_stage(), &timing_stage(),  &recheck_stage(),
                                                           &sanitizer_stage()};
  return stages;
}

nlohmann::json Verdict::to_json() const {
  nlohmann::json st = nlohmann::json::array();
  for (const auto& s : stages) st.push_back(s.to_json());
  nlohmann::json j = {{"verified", verified}, {"stage", stage ? stage_name(*stage) : ""}, {"stages", st},
                      {"median_ms", median_ms}, {"mad_ms", mad_ms}, {"eager_median_ms", eager_median_ms},
                      {"eager_mad_ms", eager_mad_ms}};
  if (pairs > 0)
    j["paired"] = {{"pairs", pairs}, {"speedup_median", speedup_median}, {"speedup_p10", speedup_p10}, {"wins", wins}};
  if (copy_gb_s > 0) j["copy_gb_s"] = copy_gb_s;
  return j;
}

const StageReport* Verdict::rejection() const {
  for (const auto& s : stages)   // a sandbox rejection follows the stage it interrupted
    if (stage && s.id == *stage && s.outcome == Outcome::kRejected) return &s;
  for (const auto& s : stages)
    if (s.outcome == Outcome::kRejected) return &s;
  return nullptr;
}

bool Gauntlet::Run::acquire_normal(StageId id) {
  if (normal) return true;
  const int ni = m.normal_index();
  auto got = ni < 0 ? Result<const InputSet*>(Status::error(Code::kInvalid, "no normal input set"))
                    : m.acquire(ni, &normal_tmp);
  if (!got) return reject(stage(id), got.status().message());
  normal = got.value();
  return true;
}

Verdict Gauntlet::run(const std::string& source, const nlohmann::json& launch, Mode mode, const std::string& set) {
  Run r(*this, source, launch, mode, set);
  take_sandbox_violation();   // what an earlier candidate's leftover thread did is not this one's
  for (const GauntletStage* s : gauntlet_stages())
    if (s->runs_in(mode) && !s->run(r)) return std::move(r.v);
  r.v.verified = true;
  r.v.binary = std::move(r.binary);
  return std::move(r.v);
}

}  // namespace kc::evolve
