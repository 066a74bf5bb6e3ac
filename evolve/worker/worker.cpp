// evolve_key (search -> promotion -> record) and verify_kernel; the daemon is in worker_daemon.cpp. See worker.h.
#include "evolve/worker/worker.h"
#include "evolve/worker/worker_steps.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "kernel_cache/bundle_trust.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "evolve/worker/child_session.h"
#include "evolve/verify/memory_cap.h"
#include "evolve/verify/sandbox.h"
#include "evolve/verify/static_check.h"
#include "runtime/fsutil.h"
#include "runtime/launch_spec.h"
#include "runtime/log.h"
#include "runtime/subprocess.h"
#include "runtime/json_util.h"
#include "runtime/temp_files.h"
#include "runtime/worker_client.h"

namespace kc::evolve {


nlohmann::json to_json(const EvolveOptions& o) {
  return {{"search", to_json(o.search)}, {"candidate_timeout_s", o.candidate_timeout_s},
          {"min_gain", o.min_gain}, {"min_pair_wins", o.min_pair_wins}, {"max_promote_tries", o.max_promote_tries}};
}

Status apply_evolve_json(EvolveOptions& o, const nlohmann::json& j) {
  if (j.is_null()) return Status::ok();
  if (!j.is_object()) return Status::error(Code::kInvalid, "settings: not a map");
  EvolveOptions n = o;
  if (auto it = j.find("search"); it != j.end()) {
    auto s = search_options_from(*it);
    if (!s) return s.status();
    n.search = s.value();
  }
  // gpu_share and jobs are the worker's own (its --settings); a job's are read but the daemon
  // keeps its own (worker_daemon.cpp).
  KC_RETURN_IF_ERROR(read_field(j, "gpu_share", n.gpu_share, 1e-3, 1.0));
  KC_RETURN_IF_ERROR(read_field(j, "jobs", n.jobs, 1, 64));
  KC_RETURN_IF_ERROR(read_field(j, "memory_share", n.memory_share, 0.0, 1.0));
  if (auto it = j.find("llm"); it != j.end() && it->is_object()) {
    KC_RETURN_IF_ERROR(read_field(*it, "api", n.llm.api));
    KC_RETURN_IF_ERROR(read_field(*it, "url", n.llm.url));
    KC_RETURN_IF_ERROR(read_field(*it, "model", n.llm.model));
    KC_RETURN_IF_ERROR(read_field(*it, "key_env", n.llm.key_env));
  }
  KC_RETURN_IF_ERROR(read_field(j, "candidate_timeout_s", n.candidate_timeout_s, 1.0, 1e6));
  KC_RETURN_IF_ERROR(read_field(j, "min_gain", n.min_gain, 0.0, 0.99));
  KC_RETURN_IF_ERROR(read_field(j, "min_pair_wins", n.min_pair_wins, 0.5, 1.0));
  KC_RETURN_IF_ERROR(read_field(j, "max_promote_tries", n.max_promote_tries, 0, 100));
  o = std::move(n);
  return Status::ok();
}

nlohmann::json EvolveResult::to_json() const {
  return {{"key", key}, {"outcome", outcome}, {"why", why}, {"eager_ms", eager_ms}, {"best_ms", best_ms},
          {"evaluated", evaluated}};
}


double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Result<std::string> read_value(const std::string& dir, const std::string& key) {
  if (!path_exists(dir + "/CURRENT")) return Status::error(Code::kNotFound, "no cache yet");
  auto st = Store::open(dir, Store::Mode::kReadOnly);
  if (!st) return st.status();
  return st.value()->get(key);
}

Status write_value(const std::string& dir, const std::string& key, const std::string& value) {
  auto st = Store::open(dir, Store::Mode::kWriter, 30000);
  if (!st) return st.status();
  return st.value()->put(key, value);
}

std::string iso_now() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}


Evaluation evaluation_of(const Candidate& c, const nlohmann::json& verdict) {
  Evaluation e;
  e.id = c.id();
  e.family = c.family;
  e.origin = c.origin;
  e.knobs = c.knobs;
  e.parents = c.parents;
  const std::string stage = verdict.value("stage", "");
  if (verdict.value("verified", false)) e.verdict = "passed";
  else if (stage == "crash" || stage == "timeout") e.verdict = stage;
  else e.verdict = "rejected";
  e.stage = stage;
  e.median_ms = verdict.value("median_ms", 0.0);
  e.mad_ms = verdict.value("mad_ms", 0.0);
  // Keep the rejecting stage's evidence (and its summary) rather than the whole verdict: records stay small.
  for (const auto& s : verdict.value("stages", nlohmann::json::array())) {
    if (s.value("outcome", "") == "rejected")
      e.evidence = {{"summary", s.value("summary", "")}, {"evidence", s.value("evidence", nlohmann::json::object())}};
    // A passed candidate keeps its resource use (registers, shared memory, spills): the LLM is shown it.
    if (e.verdict == "passed" && s.value("name", "") == "compile" && s.contains("evidence") &&
        s["evidence"].contains("resources"))
      e.evidence = {{"resources", s["evidence"]["resources"]}};
  }
  return e;
}

std::string temp_call_file(const OpCall& c) {
  std::string dir = owned_temp_path("calls");
  make_dirs(dir);
  std::string p = dir + "/" + fnv1a64_hex(c.key + std::to_string(Clock::now().time_since_epoch().count())) + ".json";
  write_file(p, to_json(c).dump());
  return p;
}

// The promotion decision on a full-mode verdict, where candidate and eager were timed pair by pair:
// the two medians must show the gain, the typical pair too, and the candidate must win at least
// min_pair_wins (90%) of the pairs, so a kernel that is faster only while eager happened to be slowed down is not
// promoted. (Spreads measured apart are not compared here: on a loaded machine both are wide, and
// pairing is what takes the load out of the comparison.)
bool beats_paired(const nlohmann::json& v, const EvolveOptions& o) {
  const double med = v.value("median_ms", 0.0), emed = v.value("eager_median_ms", 0.0);
  if (!(med > 0 && med < emed * (1 - o.min_gain))) return false;
  auto p = v.find("paired");
  if (p == v.end() || !p->is_object()) return false;
  return p->value("speedup_median", 0.0) >= 1 + o.min_gain && p->value("wins", 0.0) >= o.min_pair_wins;
}

SearchProgress progress_of(const Search& search, double eager_ms) {
  SearchProgress p;
  p.generation = search.state().generation;
  p.max_generations = search.options().max_generations;
  p.evaluated = static_cast<int>(search.state().tried.size());
  p.eager_ms = eager_ms;
  auto ranked = search.ranked();
  if (!ranked.empty()) p.best_ms = ranked.front()->median_ms;
  return p;
}


bool is_recorded_kernel(const Record& r, const std::string& source, const nlohmann::json& launch) {
  if (r.source != source) return false;
  auto spec = parse_launch_spec(launch);   // records hold the spec normalised (make_manual_record)
  return spec && to_json(spec.value()) == r.launch;
}

void record_verdict_facts(Record& r, const nlohmann::json& verdict, bool repeatable) {
  if (!repeatable) r.determinism = Determinism::kVaries;
  auto stages = verdict.find("stages");
  if (stages == verdict.end() || !stages->is_array()) return;
  const nlohmann::json* numerics = nullptr;
  for (const auto& s : *stages)
    if (s.is_object() && s.value("name", "") == "numerics" && s.value("outcome", "") == "passed") numerics = &s;
  if (!numerics || !numerics->contains("evidence") || !(*numerics)["evidence"].is_object()) return;
  const nlohmann::json& ev = (*numerics)["evidence"];
  if (auto d = ev.find("bitwise_deterministic"); d != ev.end() && d->is_boolean())
    r.determinism = d->get<bool>() && repeatable ? Determinism::kBitwise : Determinism::kVaries;
  std::vector<double> budget;
  for (const auto& set : ev.value("sets", nlohmann::json::array())) {
    const auto outs = set.is_object() ? set.value("outputs", nlohmann::json::array()) : nlohmann::json::array();
    for (size_t j = 0; j < outs.size(); ++j) {
      const double b = outs[j].value("budget", 0.0) + outs[j].value("eager_error", 0.0);
      if (!std::isfinite(b)) continue;
      if (budget.size() <= j) budget.resize(j + 1, 0.0);
      budget[j] = std::max(budget[j], 2 * b);
    }
  }
  r.budget = std::move(budget);
}

Result<std::string> verified_binary(const nlohmann::json& verdict) {
  if (!verdict.value("verified", false) || !verdict.contains("binary") || !verdict["binary"].is_string())
    return Status::error(Code::kInvalid, "the verdict carries no verified binary");
  std::string hash;
  for (const auto& s : verdict.value("stages", nlohmann::json::array()))
    if (s.value("name", "") == "compile") hash = s.value("evidence", nlohmann::json::object()).value("binary_hash", "");
  auto bin = from_base64(verdict["binary"].get<std::string>());
  if (!bin) return bin.status();
  if (hash.empty() || binary_hash(bin.value()) != hash)
    return Status::error(Code::kInvalid, "the binary handed back is not the one the compile stage verified");
  return bin;
}

Result<nlohmann::json> verify_kernel(const nlohmann::json& call_json, const std::string& source,
                                     const nlohmann::json& launch, int device, const EvolveOptions& o) {
  auto call = call_from_json(call_json);
  if (!call) return call.status();
  // The cheapest stage first, here: a kernel the static rules reject never costs a child (nor
  // the reference inputs of a huge key).
  if (StaticReport rep = static_check(source, call.value()); !rep.ok())
    return nlohmann::json{{"verified", false}, {"stage", "static"},
                          {"stages", {{{"name", "static"}, {"outcome", "rejected"}, {"summary", rep.first_error()},
                                       {"evidence", rep.to_json()}, {"millis", 0}}}}};
  const int64_t mem_cap = eval_memory_cap(o.memory_share);
  if (std::string why = memory_refusal(call.value(), mem_cap); !why.empty()) return Status::error(Code::kUnavailable, why);
  std::string file = temp_call_file(call.value());
  RemoveAtScopeEnd remove_file(file);   // kept while the session lives: a crash's replay restarts the child
  std::vector<std::string> argv = {o.self_exe, "eval-child", "--device", std::to_string(device), "--call", file,
                                   "--cpu-limit-s", std::to_string(sandbox_cpu_seconds(o.candidate_timeout_s))};
  if (mem_cap > 0 && call.value().backend == BackendKind::kCpu)
    argv.insert(argv.end(), {"--address-space-mb", std::to_string(mem_cap >> 20)});
  ChildSession child(argv, o);
  if (Status s = child.ensure(); !s) return s;
  return child.evaluate("verify", source, launch, "full");
}

}  // namespace kc::evolve
