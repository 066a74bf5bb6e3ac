// Stage sanitizer: the candidate alone in a child with buffers at their exact sizes, under
// compute-sanitizer's tools (CUDA) or AddressSanitizer (CPU): sanitizers.h. Full mode runs it on
// the normal set; sanitize mode (a crash's replay) on the set the crash happened in.
#include "evolve/verify/broker.h"
#include "evolve/verify/gauntlet_run.h"
#include "evolve/verify/sanitizers.h"

namespace kc::evolve {
namespace {

// The candidate's run for the sanitizers: the bytes each input may be read at, in the key's layout.
SanitizerRun sanitizer_run(const Gauntlet::Run& r, const InputSet& set) {
  SanitizerRun run;
  run.backend = r.c.backend;
  run.device = r.m.device;
  run.source = r.source;
  run.binary = r.binary;
  run.call = to_json(r.c);
  run.launch = r.launch;
  for (size_t k = 0; k < set.inputs.size(); ++k) {
    const at::Tensor& t = set.inputs[k];
    const int64_t n = extent_bytes(r.c.inputs[k]);
    if (!t.defined() || n == 0) {
      run.inputs.emplace_back();
      continue;
    }
    at::Tensor h = t.as_strided({n / static_cast<int64_t>(t.element_size())}, {1}).cpu();
    run.inputs.emplace_back(static_cast<const char*>(h.data_ptr()), static_cast<size_t>(n));
  }
  return run;
}

class SanitizerStage final : public GauntletStage {
 public:
  StageId id() const override { return StageId::kSanitizer; }
  bool runs_in(Mode mode) const override { return mode != Mode::kSearch; }
  bool run(Gauntlet::Run& r) const override {
    Gauntlet::Impl& m = r.m;
    InputSet tmp;
    const InputSet* set = r.mode == Mode::kSanitize ? nullptr : r.normal;
    for (size_t i = 0; i < m.sets.size() && !set; ++i)
      if (m.sets[i].name == r.set_name)
        if (auto got = m.acquire(i, &tmp)) set = got.value();
    if (!set) return r.reject(r.stage(id()), "no input set '" + r.set_name + "'");
    r.at(id(), set->name, 1);
    // The runner sandboxes itself; a sandboxed child has its broker start it.
    const SanitizerRun run = sanitizer_run(r, *set);
    r.v.stages.push_back(m.opt.broker ? m.opt.broker->sanitize(run) : run_sanitizers(run, m.opt));
    if (m.opt.broker && m.opt.broker->broken()) m.lost = true;
    if (r.v.stages.back().outcome != Outcome::kRejected) return true;
    r.v.stage = id();
    return false;
  }
};

}  // namespace

const GauntletStage& sanitizer_stage() {
  static const SanitizerStage s;
  return s;
}

}  // namespace kc::evolve
