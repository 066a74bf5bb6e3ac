// The verification gauntlet's stages (list and rationale in gauntlet.h); its setup and working
// state are gauntlet_setup.cpp and gauntlet_impl.h.
#include "evolve/gauntlet.h"

#include <algorithm>
#include <chrono>

#include "evolve/broker.h"
#include "evolve/gauntlet_impl.h"
#include "evolve/gauntlet_run.h"
#include "evolve/preprocess.h"
#include "evolve/sandbox.h"
#include "evolve/sanitizers.h"
#include "evolve/static_check.h"
#include "runtime/binary_check.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {

nlohmann::json Verdict::to_json() const {
  nlohmann::json st = nlohmann::json::array();
  for (const auto& s : stages)
    st.push_back({{"name", s.name}, {"outcome", s.outcome}, {"summary", s.summary}, {"evidence", s.evidence},
                  {"millis", s.millis}});
  nlohmann::json j = {{"verified", verified}, {"stage", stage}, {"stages", st}, {"median_ms", median_ms},
                      {"mad_ms", mad_ms}, {"eager_median_ms", eager_median_ms}, {"eager_mad_ms", eager_mad_ms}};
  if (pairs > 0)
    j["paired"] = {{"pairs", pairs}, {"speedup_median", speedup_median}, {"speedup_p10", speedup_p10}, {"wins", wins}};
  return j;
}

const Stage* Verdict::rejection() const {
  for (const auto& s : stages)   // a sandbox rejection follows the stage it interrupted
    if (!stage.empty() && s.name == stage && s.outcome == "rejected") return &s;
  for (const auto& s : stages)
    if (s.outcome == "rejected") return &s;
  return nullptr;
}

bool Gauntlet::sanitize(Verdict& v, const std::string& source, const std::string& binary, const nlohmann::json& launch,
                        const InputSet& set) {
  Impl& m = *p_;
  if (m.opt.progress) m.opt.progress({{"stage", "sanitizer"}, {"set", set.name}, {"call", 1}});
  SanitizerRun run;
  run.backend = m.call.backend;
  run.device = m.device;
  run.source = source;
  run.binary = binary;
  run.call = to_json(m.call);
  run.launch = launch;
  for (size_t k = 0; k < set.inputs.size(); ++k) {
    const at::Tensor& t = set.inputs[k];
    const int64_t n = extent_bytes(m.call.inputs[k]);
    if (!t.defined() || n == 0) {
      run.inputs.emplace_back();
      continue;
    }
    // The bytes the kernel may read, in the key's layout (strides and gaps included).
    at::Tensor h = t.as_strided({n / static_cast<int64_t>(t.element_size())}, {1}).cpu();
    run.inputs.emplace_back(static_cast<const char*>(h.data_ptr()), static_cast<size_t>(n));
  }
  // The runner sandboxes itself; a sandboxed child has its broker start it.
  v.stages.push_back(m.opt.broker ? m.opt.broker->sanitize(run) : run_sanitizers(run, m.opt));
  if (m.opt.broker && m.opt.broker->broken()) m.lost = true;
  if (v.stages.back().outcome != "rejected") return true;
  v.stage = "sanitizer";
  return false;
}

bool Gauntlet::Run::static_stage() {
  auto t0 = Clock::now();
  Stage& s = stage("static");
  StaticReport rep = static_check(source, c);
  s.evidence = rep.to_json();
  if (!rep.ok()) {
    s.millis = ms_since(t0);
    return reject(s, rep.first_error(), s.evidence);
  }
  // Again on the source as the compiler sees it (preprocess.h): macros cannot hide a rule.
  auto expanded = m.opt.broker ? m.opt.broker->preprocess(source) : expand_macros(source);
  s.millis = ms_since(t0);
  if (!expanded && expanded.status().code() == Code::kCompileError)
    return reject(s, expanded.status().message(), s.evidence);
  if (!expanded) {
    s.evidence["expanded"] = "not checked: " + expanded.status().message();
    return true;
  }
  StaticReport after = static_check(expanded.value(), c);
  s.evidence["expanded"] = after.to_json();
  if (!after.ok()) return reject(s, "after macro expansion: " + after.first_error(), s.evidence);
  return true;
}

bool Gauntlet::Run::compile_stage() {
  auto t0 = Clock::now();
  Stage& s = stage("compile");
  // CPU: the host compiler is a process, which a sandboxed child asks its broker to start.
  const bool brokered = m.opt.broker && !m.cuda();
  auto out = brokered ? m.opt.broker->compile(source) : m.be->compile(source);
  if (brokered && m.opt.broker->broken()) m.lost = true;
  s.millis = ms_since(t0);
  if (!out) {
    std::string msg = out.status().message();
    return reject(s, msg.substr(0, msg.find('\n')), {{"log", msg.substr(0, 4000)}});
  }
  binary = out.value().binary;
  s.evidence["log"] = out.value().log.substr(0, 2000);
  s.evidence["compile_ms"] = out.value().millis;
  if (!m.cuda()) {   // judged on the binary too (binary_check.h); load would refuse it anyway
    BinaryCheck bc = check_cpu_binary(binary);
    s.evidence["binary"] = bc.to_json();
    if (!bc.ok()) return reject(s, "binary: " + bc.message(), s.evidence);
  }
  return true;
}

bool Gauntlet::Run::load_stage() {
  auto t0 = Clock::now();
  Stage& s = stage("load");
  auto ps = parse_launch_spec(launch);
  if (!ps) return reject(s, "launch spec: " + ps.status().message());
  auto rs = resolve(ps.value(), c.binding());
  if (!rs) return reject(s, "launch spec: " + rs.status().message());
  spec = rs.value();
  if (m.cuda()) {
    std::vector<std::string> entries;
    for (const auto& l : spec.launches) entries.push_back(l.entry);
    auto res = cuda_resources_json(m.device, binary, entries);
    if (res) {
      s.evidence["resources"] = nlohmann::json::parse(res.value());
      for (auto& [name, r] : s.evidence["resources"].items())
        if (r.value("local_bytes", 0) > 0) s.evidence["spills"] = true;
    }
  }
  auto ld = m.be->load(binary, spec);
  s.millis = ms_since(t0);
  if (!ld) return reject(s, ld.status().message());
  launcher = std::move(ld.value());
  return true;
}

// A crash's replay: the sanitizer alone on the set it died on.
bool Gauntlet::Run::sanitize_only(const std::string& set_name) {
  InputSet tmp;
  const InputSet* set = nullptr;
  for (size_t i = 0; i < m.sets.size() && !set; ++i)
    if (m.sets[i].name == set_name)
      if (auto got = m.acquire(i, &tmp)) set = got.value();
  if (!set) return reject(stage("sanitizer"), "no input set '" + set_name + "'");
  return g.sanitize(v, source, binary, launch, *set);
}

bool Gauntlet::Run::timing_stage() {
  {
    const int ni = m.normal_index();
    auto got = ni < 0 ? Result<const InputSet*>(Status::error(Code::kInvalid, "no normal input set"))
                      : m.acquire(ni, &normal_tmp);
    if (!got) return reject(stage("timing"), got.status().message());
    normal = got.value();
  }
  auto t0 = Clock::now();
  Stage& s = stage("timing");
  TimingOptions to;
  to.budget_ms = m.opt.timing_budget_ms;
  auto fn = [&]() -> Status {
    std::vector<at::Tensor> outs = m.alloc_outputs();   // as the serving path does, per call
    std::vector<at::Tensor> scratch = m.alloc_scratch(spec);
    return m.launch(*launcher, spec, normal->inputs, outs, scratch);
  };
  Result<Timing> t = Status::error(Code::kInvalid, "not timed");
  Result<Timing> eager = t;
  if (mode == "full") {   // promotion: both sides in one window, pair by pair
    auto eager_fn = [&]() -> Status { return m.eager_call(normal->inputs); };
    to.budget_ms *= 2;
    auto p = m.cuda() ? time_paired_cuda(nullptr, fn, eager_fn, to) : time_paired_cpu(fn, eager_fn, to);
    if (p) {
      t = p.value().a;
      eager = p.value().b;
      v.pairs = p.value().pairs;
      v.speedup_median = p.value().ratio_median;
      v.speedup_p10 = p.value().ratio_p10;
      v.wins = p.value().wins;
    } else {
      t = p.status();
    }
  } else {
    eager = g.eager_timing();
    if (!eager) return reject(s, "eager timing failed: " + eager.status().message());
    t = m.cuda() ? time_cuda(nullptr, fn, to) : time_cpu(fn, to);
  }
  s.millis = ms_since(t0);
  if (!t) {
    m.sync().ignore();
    return reject(s, "timing failed: " + t.status().message());
  }
  v.median_ms = t.value().median_ms;
  v.mad_ms = t.value().mad_ms;
  v.eager_median_ms = eager.value().median_ms;
  v.eager_mad_ms = eager.value().mad_ms;
  s.evidence = {{"median_ms", v.median_ms}, {"mad_ms", v.mad_ms}, {"p10_ms", t.value().p10_ms},
                {"p90_ms", t.value().p90_ms}, {"reps", t.value().reps}, {"eager_median_ms", v.eager_median_ms},
                {"eager_mad_ms", v.eager_mad_ms}, {"l2_flushed", t.value().cache_flushed}};
  if (v.pairs > 0)
    s.evidence["paired"] = {{"pairs", v.pairs}, {"speedup_median", v.speedup_median}, {"speedup_p10", v.speedup_p10},
                            {"wins", v.wins}};
  s.summary = std::to_string(v.median_ms * 1e3) + " us vs eager " + std::to_string(v.eager_median_ms * 1e3) + " us" +
              (v.pairs > 0 ? " (interleaved, " + std::to_string(v.pairs) + " pairs)" : "");
  return true;
}

// After hundreds of calls, fresh inputs: state that drifts or replays shows here.
bool Gauntlet::Run::recheck_stage() {
  try {
    auto t0 = Clock::now();
    Stage& s = stage("recheck");
    // Hundreds of calls, but never more than the recheck budget's worth of them (a 64 MiB key's
    // candidate at 0.4 s a call would spend minutes here).
    int extra = mode == "full" ? m.opt.recheck_calls : 0;
    if (v.median_ms > 0)
      extra = std::min<int>(extra, std::max(10, static_cast<int>(m.opt.recheck_budget_ms / v.median_ms)));
    for (int k = 0; k < extra; ++k) {
      std::vector<at::Tensor> outs = m.alloc_outputs();
      std::vector<at::Tensor> scratch = m.alloc_scratch(spec);
      Status ls = m.launch(*launcher, spec, normal->inputs, outs, scratch);
      if (!ls) return reject(s, "launch failed: " + ls.message());
    }
    if (Status ss = m.sync(); !ss) return reject(s, "device fault during repeated calls: " + ss.message());
    // A fresh normal set with a new seed; plus the normal set again.
    InputSet fresh;
    fresh.name = "fresh";
    fresh.inputs = make_inputs(c, "normal", ++m.fresh_seed, m.dev);
    fresh.ref = run_eager(c, fresh.inputs);
    fresh.ref64 = run_fp64(c, fresh.inputs);
    fresh.budget = normal->budget;
    fresh.tau = normal->tau;
    fresh.eager_err = normal->eager_err;
    attach_tolerance(c, fresh);   // the error model from the fresh inputs; eager's evidence from normal's
    if (!check_set(fresh, s, 2) || !check_set(*normal, s, 1)) {
      s.millis = ms_since(t0);
      sandboxed();
      return false;
    }
    s.millis = ms_since(t0);
    s.summary = std::to_string(extra) + " extra calls, then fresh inputs within budget";
    return !sandboxed();   // timing's calls included
  } catch (const std::exception& e) {
    m.sync().ignore();
    return reject(v.stages.back(), std::string("exception: ") + e.what());
  }
}

// mode "search": static..recheck; "full": and the sanitizers; "sanitize": static, compile, load,
// then the sanitizer alone (gauntlet.h).
Verdict Gauntlet::run(const std::string& source, const nlohmann::json& launch, const std::string& mode,
                      const std::string& set_name) {
  Run r(*this, source, launch, mode);
  take_sandbox_violation();   // what an earlier candidate's leftover thread did is not this one's
  if (!r.static_stage() || !r.compile_stage() || !r.load_stage()) return std::move(r.v);
  if (r.sandboxed()) return std::move(r.v);   // load-time code (constructors) ran
  if (mode == "sanitize") {
    r.v.verified = r.sanitize_only(set_name);
    return std::move(r.v);
  }
  if (!r.numerics_stage() || !r.timing_stage() || !r.recheck_stage()) return std::move(r.v);
  if (mode != "full") {
    r.v.verified = true;
    return std::move(r.v);
  }
  // The sanitizer: the candidate alone in a child, buffers at their exact sizes (sanitizers.h).
  r.v.verified = sanitize(r.v, source, r.binary, launch, *r.normal);
  return std::move(r.v);
}

}  // namespace kc::evolve
