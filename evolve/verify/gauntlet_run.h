// One gauntlet run's shared state (Gauntlet::Run) and the Stage interface: internal to the
// verification code. gauntlet.cpp holds the sequence; each stage is in its stage_<name>.cpp.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/verify/gauntlet.h"
#include "evolve/verify/gauntlet_impl.h"
#include "evolve/verify/sandbox.h"
#include "runtime/backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One candidate's way through the stages: the working state that the stages share (the binary,
// the resolved spec, the loaded kernel, the normal set). Each stage appends its report to v.
struct Gauntlet::Run {
  Gauntlet& g;
  Impl& m;
  const OpCall& c;
  const std::string& source;
  const nlohmann::json& launch;
  const Mode mode;
  const std::string& set_name;   // Mode::kSanitize: the input set to replay
  Verdict v;
  std::string binary;
  ResolvedSpec spec;
  std::unique_ptr<Launcher> launcher;
  InputSet normal_tmp;   // the normal set for timing, recheck and the sanitizer (rebuilt once if streamed)
  const InputSet* normal = nullptr;

  Run(Gauntlet& gg, const std::string& src, const nlohmann::json& l, Mode md, const std::string& set)
      : g(gg), m(*gg.p_), c(m.call), source(src), launch(l), mode(md), set_name(set) {}

  void at(StageId id, const std::string& set, int call) {
    if (m.opt.progress) m.opt.progress({{"stage", stage_name(id)}, {"set", set}, {"call", call}});
  }
  StageReport& stage(StageId id) {
    at(id, "", 0);
    v.stages.push_back(StageReport{id, Outcome::kPassed, "", nlohmann::json::object(), 0});
    return v.stages.back();
  }
  bool reject(StageReport& s, const std::string& summary, nlohmann::json ev = nlohmann::json::object()) {
    s.outcome = Outcome::kRejected;
    s.summary = summary;
    if (!ev.is_null() && !ev.empty()) s.evidence = std::move(ev);
    v.stage = s.id;
    return false;
  }
  // A system call the sandbox denied rejects the candidate whatever it computed: the call did not
  // happen, but the kernel tried what no kernel needs. Checked after each stage that ran it.
  bool sandboxed() {
    auto viol = take_sandbox_violation();
    if (!viol) return false;
    reject(stage(StageId::kSandbox), "the kernel attempted a forbidden system call: " + viol->name + " (denied)",
           viol->to_json());
    return true;
  }

  // Shared by the numerics and recheck stages (stage_numerics.cpp): one call of the candidate on
  // `in` compared against `set`; every call of a set (repeats on the normal one).
  bool call_and_compare(const InputSet& set, const std::vector<at::Tensor>& in, std::vector<at::Tensor>& outs,
                        StageReport& s, const std::string& label, int call_no, std::vector<at::Tensor>* kept = nullptr);
  bool check_set(const InputSet& set, StageReport& s, int repeats);
  // The normal input set (normal_tmp holds it when streamed); a rejection of stage `id` without it.
  bool acquire_normal(StageId id);
};

// One stage of the gauntlet. A new stage is one file defining a GauntletStage plus its line in
// gauntlet_stages() (gauntlet.cpp), which fixes the order.
class GauntletStage {
 public:
  virtual ~GauntletStage() = default;
  virtual StageId id() const = 0;
  virtual bool runs_in(Mode mode) const = 0;
  // Runs on r, appending its report to r.v; false when it rejected (r.v.stage says where) and
  // the run ends there.
  virtual bool run(Gauntlet::Run& r) const = 0;
};

// The stages (one file each: stage_<name>.cpp), and their order.
const GauntletStage& static_stage();
const GauntletStage& compile_stage();
const GauntletStage& load_stage();
const GauntletStage& numerics_stage();
const GauntletStage& timing_stage();
const GauntletStage& recheck_stage();
const GauntletStage& sanitizer_stage();
const std::vector<const GauntletStage*>& gauntlet_stages();

}  // namespace kc::evolve
