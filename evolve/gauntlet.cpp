// The verification gauntlet's stages (list and rationale in gauntlet.h); its setup and working
// state are gauntlet_setup.cpp and gauntlet_impl.h.
#include "evolve/gauntlet.h"

#include <algorithm>
#include <chrono>

#include "evolve/broker.h"
#include "evolve/gauntlet_impl.h"
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

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

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

// One call on `in` (set's values, possibly in other buffers) into `outs`, judged against set's
// references: outputs and scratch poisoned first, inputs unchanged after, every output within
// budget. `label` names the call in the evidence. With `kept`, scratch lives on across calls as
// it may when served (the caching allocator hands the same block back, not cleared): allocated
// and poisoned when `kept` is empty, then passed on as the last call left it.
bool Gauntlet::Run::call_and_compare(const InputSet& set, const std::vector<at::Tensor>& in,
                                     std::vector<at::Tensor>& outs, Stage& s, const std::string& label, int call_no,
                                     std::vector<at::Tensor>* kept) {
  InputGuard guard(in);
  const bool fresh = !kept || kept->size() != spec.scratch_bytes.size();
  std::vector<at::Tensor> scratch = fresh ? m.alloc_scratch(spec) : *kept;
  std::vector<at::Tensor> none;
  m.poison(outs, fresh ? scratch : none);
  if (kept) *kept = scratch;
  m.scrub_smem();
  at(s.name, set.name, call_no);
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

bool Gauntlet::Run::check_set(const InputSet& set, Stage& s, int repeats) {
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

// Buffer reuse, as a training loop does it: one set of input buffers, refilled in place with
// another input set's values, outputs first at the same addresses and then at new ones, and
// scratch kept as the previous call left it. A result that depends on addresses or on earlier
// calls (a memo keyed by pointer, a cache of the last result in static or __device__ memory or
// in scratch, however it is declared) fails here.
bool Gauntlet::Run::check_reuse(Stage& s) {
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
    if (!call_and_compare(*a.value(), in, outs, s, "reused buffers, first fill", 1, &kept)) return false;
  }
  InputSet tb;
  auto b = m.acquire(ib, &tb);
  if (!b) return true;
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k].defined()) in[k].copy_(b.value()->inputs[k]);
  if (!call_and_compare(*b.value(), in, outs, s, "same buffers refilled, same outputs", 2, &kept)) return false;
  std::vector<at::Tensor> moved = m.alloc_outputs();
  return call_and_compare(*b.value(), in, moved, s, "same buffers refilled, new outputs", 3, &kept);
}

bool Gauntlet::Run::numerics_stage() {
  try {
    auto t0 = Clock::now();
    Stage& s = stage("numerics");
    s.evidence["bitwise_deterministic"] = true;
    nlohmann::json sets = nlohmann::json::array();
    for (size_t i = 0; i < m.sets.size(); ++i) {
      InputSet tmp;
      auto got = m.acquire(i, &tmp);
      if (!got) return reject(s, "reference set '" + m.sets[i].name + "': " + got.status().message());
      const InputSet& set = *got.value();
      if (!check_set(set, s, set.name == "normal" ? m.opt.repeats : 1)) {
        s.millis = ms_since(t0);
        sandboxed();
        return false;
      }
      nlohmann::json b = nlohmann::json::array();
      for (size_t j = 0; j < set.budget.size(); ++j) b.push_back({{"budget", set.budget[j]}, {"eager_error", set.eager_err[j]}, {"ratio", set.worst[j]},
                     {"eager_ratio", set.eager_ratio[j]}});
      sets.push_back({{"set", set.name}, {"outputs", b}});
    }
    s.evidence["sets"] = sets;
    if (!check_reuse(s)) {
      s.millis = ms_since(t0);
      sandboxed();
      return false;
    }
    s.millis = ms_since(t0);
    s.summary = std::to_string(m.sets.size()) + " input sets within budget, buffers reused";
    return !sandboxed();
  } catch (const std::exception& e) {
    Stage& s = v.stages.back();
    m.sync().ignore();
    return reject(s, std::string("exception: ") + e.what());
  }
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
