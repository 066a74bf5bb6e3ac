// Stage numerics (gauntlet.h): every input set against its references, repeated calls, and
// buffer reuse; and the per-call comparison the recheck stage uses too (Gauntlet::Run).
#include <exception>
#include <string>
#include <vector>

#include "evolve/ops/eager.h"
#include "evolve/verify/gauntlet_run.h"
#include "evolve/verify/numerics.h"

namespace kc::evolve {

// One call on `in` (set's values, possibly in other buffers) into `outs`, judged against set's
// references: outputs and scratch poisoned first, inputs unchanged after, every output within
// budget. `label` names the call in the evidence. With `kept`, scratch lives on across calls as
// it may when served (the caching allocator hands the same block back, not cleared): allocated
// and poisoned when `kept` is empty, then passed on as the last call left it.
bool Gauntlet::Run::call_and_compare(const InputSet& set, const std::vector<at::Tensor>& in,
                                     std::vector<at::Tensor>& outs, StageReport& s, const std::string& label, int call_no,
                                     std::vector<at::Tensor>* kept) {
  InputGuard guard(in);
  const bool fresh = !kept || kept->size() != spec.scratch_bytes.size();
  std::vector<at::Tensor> scratch = fresh ? m.alloc_scratch(spec) : *kept;
  std::vector<at::Tensor> none;
  m.poison(outs, fresh ? scratch : none);
  if (kept) *kept = scratch;
  m.scrub_smem();
  at(s.id, set.name, call_no);
  Status ls = m.launch(*launcher, spec, in, outs, scratch);
  if (!ls) return reject(s, "launch failed: " + ls.message(), {{"set", set.name}, {"call", label}, {"error", ls.to_string()}});
  Status ss = m.sync();
  if (!ss) return reject(s, ss.message(), {{"set", set.name}, {"call", label}, {"error", ss.to_string()}});
  for (size_t k = 0; k < in.size(); ++k)
    if (!guard.unchanged(k, in[k]))
      return reject(s, "the kernel wrote into its input '" + c.inputs[k].name + "'",
                    {{"set", set.name}, {"input", c.inputs[k].name}});
  for (size_t j = 0; j < outs.size(); ++j) {
    auto bad = compare(c.outputs[j].name, outs[j], set, j);
    if (!bad) continue;
    (*bad)["set"] = set.name;
    (*bad)["call"] = label;
    (*bad)["eager_error"] = set.eager_err[j];
    std::string summary = "set '" + set.name + "' (" + label + ") output " + c.outputs[j].name + " " +
                          bad->value("check", std::string("mismatch")) + " at " + bad->value("index", std::string("?")) +
                          ": expected " + num(bad->value("expected", 0.0)) + ", got " + num(bad->value("actual", 0.0));
    return reject(s, summary, *bad);
  }
  return true;
}

bool Gauntlet::Run::check_set(const InputSet& set, StageReport& s, int repeats) {
  std::vector<at::Tensor> first;
  for (int r = 0; r < repeats; ++r) {
    std::vector<at::Tensor> outs = m.alloc_outputs();
    if (!call_and_compare(set, set.inputs, outs, s, "call " + std::to_string(r + 1), r + 1)) return false;
    if (r == 0) first = outs;
    else
      for (size_t j = 0; j < outs.size(); ++j)
        if (!same_bits(outs[j], first[j])) s.evidence["bitwise_deterministic"] = false;
  }
  return true;
}

namespace {

// Buffer reuse, as a training loop does it: one set of input buffers, refilled in place with
// another input set's values, outputs first at the same addresses and then at new ones, and
// scratch kept as the previous call left it. A result that depends on addresses or on earlier
// calls (a memo keyed by pointer, a cache of the last result in static or __device__ memory or
// in scratch, however it is declared) fails here.
bool check_reuse(Gauntlet::Run& r, StageReport& s) {
  Gauntlet::Impl& m = r.m;
  const OpCall& c = r.c;
  const int ia = m.normal_index();
  int ib = -1;
  for (size_t i = 0; i < m.sets.size(); ++i)
    if (static_cast<int>(i) != ia && m.sets[i].name != "captured" && m.sets[i].name != "special" && ib < 0)
      ib = static_cast<int>(i);
  if (ia < 0 || ib < 0) return true;
  std::vector<at::Tensor> in, kept;
  std::vector<at::Tensor> outs = m.alloc_outputs();
  {   // a streamed set A is released before B is built: one set's tensors at a time
    InputSet ta;
    auto a = m.acquire(ia, &ta);
    if (!a) return true;
    for (size_t k = 0; k < c.inputs.size(); ++k) {
      const at::Tensor& src = a.value()->inputs[k];
      in.push_back(src.defined() ? empty_like_meta(c.inputs[k], m.dev).copy_(src) : at::Tensor());
    }
    if (!r.call_and_compare(*a.value(), in, outs, s, "reused buffers, first fill", 1, &kept)) return false;
  }
  InputSet tb;
  auto b = m.acquire(ib, &tb);
  if (!b) return true;
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k].defined()) in[k].copy_(b.value()->inputs[k]);
  if (!r.call_and_compare(*b.value(), in, outs, s, "same buffers refilled, same outputs", 2, &kept)) return false;
  std::vector<at::Tensor> moved = m.alloc_outputs();
  return r.call_and_compare(*b.value(), in, moved, s, "same buffers refilled, new outputs", 3, &kept);
}

class NumericsStage final : public GauntletStage {
 public:
  StageId id() const override { return StageId::kNumerics; }
  bool runs_in(Mode mode) const override { return mode != Mode::kSanitize; }
  bool run(Gauntlet::Run& r) const override;
};

bool NumericsStage::run(Gauntlet::Run& r) const {
  Gauntlet::Impl& m = r.m;
  try {
    auto t0 = Clock::now();
    StageReport& s = r.stage(id());
    s.evidence["bitwise_deterministic"] = true;
    nlohmann::json sets = nlohmann::json::array();
    for (size_t i = 0; i < m.sets.size(); ++i) {
      InputSet tmp;
      auto got = m.acquire(i, &tmp);
      if (!got) return r.reject(s, "reference set '" + m.sets[i].name + "': " + got.status().message());
      const InputSet& set = *got.value();
      if (!r.check_set(set, s, set.name == "normal" ? m.opt.repeats : 1)) {
        s.millis = ms_since(t0);
        r.sandboxed();
        return false;
      }
      nlohmann::json b = nlohmann::json::array();
      for (size_t j = 0; j < set.budget.size(); ++j) b.push_back({{"budget", set.budget[j]}, {"eager_error", set.eager_err[j]}, {"ratio", set.worst[j]},
                     {"eager_ratio", set.eager_ratio[j]}});
      sets.push_back({{"set", set.name}, {"outputs", b}});
    }
    s.evidence["sets"] = sets;
    if (!check_reuse(r, s)) {
      s.millis = ms_since(t0);
      r.sandboxed();
      return false;
    }
    s.millis = ms_since(t0);
    s.summary = std::to_string(m.sets.size()) + " input sets within budget, buffers reused";
    return !r.sandboxed();
  } catch (const std::exception& e) {
    StageReport& s = r.v.stages.back();
    m.sync().ignore();
    return r.reject(s, std::string("exception: ") + e.what());
  }
}

}  // namespace

const GauntletStage& numerics_stage() {
  static const NumericsStage s;
  return s;
}

}  // namespace kc::evolve
