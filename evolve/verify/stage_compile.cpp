// Stage compile: NVRTC or the host compiler. CPU shared objects are judged on the binary too
// (imports, load-time code, system calls: runtime/binary_check.h); load would refuse them anyway.
#include "evolve/verify/broker.h"
#include "evolve/verify/gauntlet_run.h"
#include "kernel_cache/bundle_trust.h"
#include "runtime/binary_check.h"

namespace kc::evolve {
namespace {

class CompileStage final : public GauntletStage {
 public:
  StageId id() const override { return StageId::kCompile; }
  bool runs_in(Mode) const override { return true; }
  bool run(Gauntlet::Run& r) const override {
    auto t0 = Clock::now();
    StageReport& s = r.stage(id());
    Gauntlet::Impl& m = r.m;
    // CPU: the host compiler is a process, which a sandboxed child asks its broker to start.
    const bool brokered = m.opt.broker && !m.cuda();
    auto out = brokered ? m.opt.broker->compile(r.source) : m.be->compile(r.source);
    if (brokered && m.opt.broker->broken()) m.lost = true;
    s.millis = ms_since(t0);
    if (!out) {
      std::string msg = out.status().message();
      return r.reject(s, msg.substr(0, msg.find('\n')), {{"log", msg.substr(0, 4000)}});
    }
    r.binary = out.value().binary;
    s.evidence["binary_hash"] = binary_hash(r.binary);
    s.evidence["log"] = out.value().log.substr(0, 2000);
    s.evidence["compile_ms"] = out.value().millis;
    if (!m.cuda()) {
      BinaryCheck bc = check_cpu_binary(r.binary);
      s.evidence["binary"] = bc.to_json();
      if (!bc.ok()) return r.reject(s, "binary: " + bc.message(), s.evidence);
    }
    return true;
  }
};

}  // namespace

const GauntletStage& compile_stage() {
  static const CompileStage s;
  return s;
}

}  // namespace kc::evolve
