// Stage load: the launch spec resolved for the key, resource use read from the CUBIN, the module
// loaded and its entry points found. Load-time code has run by then: the sandbox is checked.
#include "evolve/verify/gauntlet_run.h"
#include "runtime/cuda_backend.h"

namespace kc::evolve {
namespace {

class LoadStage final : public GauntletStage {
 public:
  StageId id() const override { return StageId::kLoad; }
  bool runs_in(Mode) const override { return true; }
  bool run(Gauntlet::Run& r) const override {
    auto t0 = Clock::now();
    StageReport& s = r.stage(id());
    auto ps = parse_launch_spec(r.launch);
    if (!ps) return r.reject(s, "launch spec: " + ps.status().message());
    auto rs = resolve(ps.value(), r.c.binding());
    if (!rs) return r.reject(s, "launch spec: " + rs.status().message());
    r.spec = rs.value();
    if (r.m.cuda()) {
      std::vector<std::string> entries;
      for (const auto& l : r.spec.launches) entries.push_back(l.entry);
      if (auto res = cuda_resources_json(r.m.device, r.binary, entries)) {
        s.evidence["resources"] = nlohmann::json::parse(res.value());
        for (auto& [name, used] : s.evidence["resources"].items())
          if (used.value("local_bytes", 0) > 0) s.evidence["spills"] = true;
      }
    }
    auto ld = r.m.be->load(r.binary, r.spec);
    s.millis = ms_since(t0);
    if (!ld) return r.reject(s, ld.status().message());
    r.launcher = std::move(ld.value());
    return !r.sandboxed();   // load-time code (constructors) ran
  }
};

}  // namespace

const GauntletStage& load_stage() {
  static const LoadStage s;
  return s;
}

}  // namespace kc::evolve
