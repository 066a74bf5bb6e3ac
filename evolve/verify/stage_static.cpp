// Stage static: the source rules (static_check.h) on the source as written, then again on the
// source as the compiler sees it (preprocess.h), so that macros cannot hide a rule.
#include "evolve/verify/broker.h"
#include "evolve/verify/gauntlet_run.h"
#include "evolve/verify/preprocess.h"
#include "evolve/verify/static_check.h"

namespace kc::evolve {
namespace {

class StaticStage final : public GauntletStage {
 public:
  StageId id() const override { return StageId::kStatic; }
  bool runs_in(Mode) const override { return true; }
  bool run(Gauntlet::Run& r) const override {
    auto t0 = Clock::now();
    StageReport& s = r.stage(id());
    StaticReport rep = static_check(r.source, r.c);
    s.evidence = rep.to_json();
    if (!rep.ok()) {
      s.millis = ms_since(t0);
      return r.reject(s, rep.first_error(), s.evidence);
    }
    auto expanded = r.m.opt.broker ? r.m.opt.broker->preprocess(r.source) : expand_macros(r.source);
    s.millis = ms_since(t0);
    if (!expanded && expanded.status().code() == Code::kCompileError)
      return r.reject(s, expanded.status().message(), s.evidence);
    if (!expanded) {
      s.evidence["expanded"] = "not checked: " + expanded.status().message();
      return true;
    }
    StaticReport after = static_check(expanded.value(), r.c);
    s.evidence["expanded"] = after.to_json();
    if (!after.ok()) return r.reject(s, "after macro expansion: " + after.first_error(), s.evidence);
    return true;
  }
};

}  // namespace

const GauntletStage& static_stage() {
  static const StaticStage s;
  return s;
}

}  // namespace kc::evolve
