// One gauntlet run's state and stages (Gauntlet::Run): internal to gauntlet.cpp, which holds the
// sequence and the static, compile, load, timing and recheck stages, and gauntlet_numerics.cpp,
// which holds the numerics stage and its call, set and buffer-reuse checks.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/gauntlet.h"
#include "evolve/gauntlet_impl.h"
#include "evolve/sandbox.h"
#include "runtime/backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {

using Clock = std::chrono::steady_clock;
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One candidate's way through the stages: the working state that the stages share (the binary,
// the resolved spec, the loaded kernel, the normal set) and one method per stage. Each stage
// appends its Stage to v; false when it rejected (v.stage names it) and the run ends there.
struct Gauntlet::Run {
  Gauntlet& g;
  Impl& m;
  const OpCall& c;
  const std::string& source;
  const nlohmann::json& launch;
  const std::string& mode;
  Verdict v;
  std::string binary;
  ResolvedSpec spec;
  std::unique_ptr<Launcher> launcher;
  InputSet normal_tmp;   // the normal set for timing, recheck and the sanitizer (rebuilt once if streamed)
  const InputSet* normal = nullptr;

  Run(Gauntlet& gg, const std::string& src, const nlohmann::json& l, const std::string& md)
      : g(gg), m(*gg.p_), c(m.call), source(src), launch(l), mode(md) {}

  void at(const std::string& stage_name, const std::string& set, int call) {
    if (m.opt.progress) m.opt.progress({{"stage", stage_name}, {"set", set}, {"call", call}});
  }
  Stage& stage(const std::string& name) {
    at(name, "", 0);
    v.stages.push_back(Stage{name, "passed", "", nlohmann::json::object(), 0});
    return v.stages.back();
  }
  bool reject(Stage& s, const std::string& summary, nlohmann::json ev = nlohmann::json::object()) {
    s.outcome = "rejected";
    s.summary = summary;
    if (!ev.is_null() && !ev.empty()) s.evidence = std::move(ev);
    v.stage = s.name;
    return false;
  }
  // A system call the sandbox denied rejects the candidate whatever it computed: the call did not
  // happen, but the kernel tried what no kernel needs. Checked after each stage that ran it.
  bool sandboxed() {
    auto viol = take_sandbox_violation();
    if (!viol) return false;
    reject(stage("sandbox"), "the kernel attempted a forbidden system call: " + viol->name + " (denied)", viol->to_json());
    return true;
  }

  bool static_stage();
  bool compile_stage();
  bool load_stage();
  bool sanitize_only(const std::string& set_name);
  bool call_and_compare(const InputSet& set, const std::vector<at::Tensor>& in, std::vector<at::Tensor>& outs,
                        Stage& s, const std::string& label, int call_no, std::vector<at::Tensor>* kept = nullptr);
  bool check_set(const InputSet& set, Stage& s, int repeats);
  bool check_reuse(Stage& s);
  bool numerics_stage();
  bool timing_stage();
  bool recheck_stage();
};

}  // namespace kc::evolve
