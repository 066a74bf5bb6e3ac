// One key's evolution (worker.h evolve_key): resume, search, promote, or remember eager as best.
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "evolve/worker/child_session.h"
#include "evolve/propose/llm.h"
#include "evolve/verify/memory_cap.h"
#include "evolve/verify/sandbox.h"
#include "evolve/worker/worker.h"
#include "evolve/worker/worker_steps.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "runtime/log.h"
#include "runtime/temp_files.h"

namespace kc::evolve {

namespace {

// ": why" from a rejected evaluation's summary (evaluation_of keeps the rejecting stage's), cut to
// one line; "" when none.
std::string refusal_summary(const Evaluation& e) {
  std::string s = e.evidence.value("summary", "");
  s = s.substr(0, std::min(s.find('\n'), size_t{240}));
  return s.empty() ? "" : ": " + s;
}

// One key's evolution: the call, what the cache already says about it, the search, the evaluation
// child, and the result. Phases: prepare (nothing to do?), start the child, search, promote, or
// remember eager as best.
class KeySearch {
 public:
  KeySearch(const std::string& key, const std::string& job_file, int device, const EvolveOptions& o)
      : key_(key), job_file_(job_file), device_(device), o_(o) {
    res_.key = key;
    if (o_.llm.enabled()) freeform_.push_back(std::make_unique<LlmProposer>(o_.llm));
  }

  EvolveResult run() {
    if (auto done = prepare()) return *done;
    if (auto done = start_child()) return *done;
    if (auto done = search_loop()) return *done;
    if (auto done = promote()) return *done;
    return eager_best();
  }

 private:
  void say(const std::string& s) {
    if (o_.progress) o_.progress(s);
  }
  EvolveResult fail(const std::string& why) {
    res_.outcome = "failed";
    res_.why = why;
    say("failed: " + why);
    return res_;
  }
  EvolveResult ended(const char* outcome, const std::string& why) {
    res_.outcome = outcome;
    res_.why = why;
    return res_;
  }
  void persist() {
    Status s = write_value(o_.cache_dir, search_state_key(key_), to_json(search_->state()).dump());
    if (!s) log(LogLevel::kWarn, "cannot save the search state of " + key_ + ": " + s.to_string());
  }
  // A kernel someone stored by hand while we searched (put_kernel, cache put/import) wins: never
  // overwrite a served record this search did not write.
  bool taken_meanwhile() {
    auto v = read_value(o_.cache_dir, key_);
    if (!v) return false;
    auto rec = decode_record(v.value());
    return rec && rec->state == RecordState::kServed;
  }

  std::optional<EvolveResult> prepare();
  std::optional<EvolveResult> start_child();
  std::optional<EvolveResult> search_loop();
  void ask_freeform(Search& search, std::vector<Candidate>& batch);
  void rest_after(const nlohmann::json& verdict, const Evaluation& e, double dt);
  std::optional<EvolveResult> promote();
  Result<Record> promoted_record(const Evaluation& e, const Candidate& cand, nlohmann::json v);
  EvolveResult eager_best();

  const std::string& key_;
  const std::string& job_file_;
  const int device_;
  const EvolveOptions& o_;
  EvolveResult res_;
  OpCall call_;
  std::optional<Record> disabled_;   // a record the live check disabled: never stored again
  std::unique_ptr<Search> search_;
  std::vector<std::unique_ptr<FreeformProposer>> freeform_;   // the configured free-form proposers
  int64_t mem_cap_ = 0;
  double eager_mad_ = 0;
  nlohmann::json attempts_ = nlohmann::json::array();   // promotions refused
  std::unique_ptr<RemoveAtScopeEnd> call_file_;         // before child_: removed after the child ends
  std::unique_ptr<ChildSession> child_;
};

std::optional<EvolveResult> KeySearch::prepare() {
  auto call = call_from_key(key_);
  if (!call) return fail(call.status().to_string());
  call_ = std::move(call.value());
  // A disabled record (the live check caught it on real data: kernel_cache/disable.h) may be
  // searched again, but its kernel is never stored again, and its evidence is kept.
  if (auto existing = read_value(o_.cache_dir, key_)) {
    auto rec = decode_record(existing.value());
    if (rec && (rec->state == RecordState::kServed || rec->state == RecordState::kEagerBest))
      return ended("exists", state_name(rec->state));
    if (rec && rec->state == RecordState::kDisabled) disabled_ = std::move(rec.value());
  }
  SearchState state;
  if (auto saved = read_value(o_.cache_dir, search_state_key(key_))) {
    auto parsed = parse_search_state(saved.value());
    if (!parsed) say("the saved search state does not read (" + parsed.status().to_string() + "); starting afresh");
    else state = std::move(parsed.value());
    say("resuming: " + std::to_string(state.tried.size()) + " candidates already evaluated, generation " +
        std::to_string(state.generation));
  }
  search_ = std::make_unique<Search>(call_, o_.search, state);
  // A key too large for the memory cap is skipped before a child exists (memory_cap.h).
  mem_cap_ = eval_memory_cap(o_.memory_share);
  if (std::string why = memory_refusal(call_, mem_cap_); !why.empty()) {
    say(why);
    return ended("skipped", why);
  }
  return std::nullopt;
}

std::optional<EvolveResult> KeySearch::start_child() {
  // The child lives for the search and the promotion's full runs: its CPU-time bound (sandbox.h).
  const double lifetime_s = o_.search.key_budget_s + o_.max_promote_tries * o_.candidate_timeout_s;
  std::vector<std::string> argv = {o_.self_exe, "eval-child", "--device", std::to_string(device_), "--cpu-limit-s",
                                   std::to_string(sandbox_cpu_seconds(lifetime_s))};
  if (mem_cap_ > 0 && call_.backend == BackendKind::kCpu)
    argv.insert(argv.end(), {"--address-space-mb", std::to_string(mem_cap_ >> 20)});
  if (!job_file_.empty()) {
    argv.insert(argv.end(), {"--job", job_file_});
  } else {
    const std::string file = temp_call_file(call_);
    call_file_ = std::make_unique<RemoveAtScopeEnd>(file);
    argv.insert(argv.end(), {"--call", file});
  }
  child_ = std::make_unique<ChildSession>(argv, o_);
  if (Status s = child_->ensure(); !s) return fail(s.to_string());
  res_.eager_ms = child_->ready()["eager"].value("median_ms", 0.0);
  eager_mad_ = child_->ready()["eager"].value("mad_ms", 0.0);
  say("eager " + std::to_string(res_.eager_ms * 1e3) + " us; input sets " + child_->ready()["sets"].dump() +
      (child_->ready().value("resident", true) ? "" : ", rebuilt for each candidate (a large key)"));
  return std::nullopt;
}

// Each free-form proposer's kernel for this generation joins the batch (and the search state).
void KeySearch::ask_freeform(Search& search, std::vector<Candidate>& batch) {
  search.freeform_asked();
  for (const auto& p : freeform_) {
    auto t0 = Clock::now();
    auto k = p->propose(call_, search.freeform_context(*p, res_.eager_ms));
    auto c = k ? search.add_proposal(*p, k.value()) : Result<Candidate>(k.status());
    search.add_elapsed(secs_since(t0));
    if (c) batch.push_back(std::move(c.value()));
    else say(std::string(p->name()) + " proposer: " + c.status().to_string());
  }
}

std::optional<EvolveResult> KeySearch::search_loop() {
  Search& search = *search_;
  auto t_run = Clock::now();
  while (!search.state().finished) {
    std::vector<Candidate> batch = search.next_batch();
    if (!batch.empty() && !freeform_.empty() && search.freeform_due()) ask_freeform(search, batch);
    persist();
    if (batch.empty()) break;
    for (const Candidate& c : batch) {
      if (o_.stop && o_.stop->load()) {
        persist();
        res_.outcome = "stopped";
        return res_;
      }
      auto t0 = Clock::now();
      auto verdict = child_->evaluate(c.id(), c.source, c.launch, "search");
      if (!verdict) {
        persist();
        return fail(verdict.status().to_string());
      }
      Evaluation e = evaluation_of(c, verdict.value());
      const double dt = secs_since(t0);
      search.add_elapsed(dt);
      e.at_s = search.state().elapsed_s;
      search.report(e);
      ++res_.evaluated;
      persist();
      say(e.id + ": " + e.verdict +
          (e.passed() ? " " + std::to_string(e.median_ms * 1e3) + " us" : " at " + e.stage + refusal_summary(e)));
      if (o_.on_step) o_.on_step(progress_of(search, res_.eager_ms));
      rest_after(verdict.value(), e, dt);
      if (search.stop_if_out_of_time()) break;
    }
    if (!search.state().finished) search.end_generation(res_.eager_ms);
    persist();
  }
  say("search ended (" + search.state().finish_reason + ") after " + std::to_string(secs_since(t_run)) +
      " s; first verified candidate at " + std::to_string(search.first_verified_s()) + " s, the best at " +
      std::to_string(search.best_found_s()) + " s of search");
  return std::nullopt;
}

// The duty cycle: leave the GPU to the user's job most of the time. Busy = the stages that run on
// the device (compiles and static checks are CPU work); a crash or timeout counts whole.
void KeySearch::rest_after(const nlohmann::json& verdict, const Evaluation& e, double dt) {
  if (o_.gpu_share >= 1.0) return;
  double busy_ms = 0;
  for (const auto& st : verdict.value("stages", nlohmann::json::array()))
    if (st.value("name", "") != "static" && st.value("name", "") != "compile") busy_ms += st.value("millis", 0.0);
  if (e.verdict == "crash" || e.verdict == "timeout") busy_ms = dt * 1e3;
  const double rest = busy_ms / 1e3 * (1.0 / o_.gpu_share - 1.0);
  for (double slept = 0; slept < rest && !(o_.stop && o_.stop->load()); slept += 0.05)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// Promotion: the fastest verified candidates, through the full gauntlet, until one holds.
std::optional<EvolveResult> KeySearch::promote() {
  auto ranked = search_->ranked();
  if (!ranked.empty()) res_.best_ms = ranked.front()->median_ms;
  for (size_t k = 0; k < ranked.size() && static_cast<int>(k) < o_.max_promote_tries; ++k) {
    const Evaluation& e = *ranked[k];
    // Worth the full gauntlet if its search timing showed the gain; the interleaved timing there
    // decides (sorted: the rest are slower).
    if (!(e.median_ms > 0 && e.median_ms < res_.eager_ms * (1 - o_.min_gain))) break;
    auto cand = search_->render(e.family, e.knobs);
    if (!cand) continue;
    if (disabled_ && is_recorded_kernel(*disabled_, cand.value().source, cand.value().launch)) {
      say("not promoting " + e.id + ": it is the kernel the live check disabled for this key");
      attempts_.push_back({{"id", e.id}, {"stage", "disabled"}, {"why", "the kernel disabled by the live check"}});
      continue;
    }
    auto verdict = child_->evaluate(e.id, cand.value().source, cand.value().launch, "full");
    if (!verdict) return fail(verdict.status().to_string());
    const nlohmann::json& v = verdict.value();
    if (!v.value("verified", false) || !beats_paired(v, o_)) {
      const Evaluation refused = evaluation_of(cand.value(), v);
      attempts_.push_back({{"id", e.id}, {"verdict", refused.evidence},
                           {"stage", v.value("stage", "")}, {"median_ms", v.value("median_ms", 0.0)},
                           {"eager_median_ms", v.value("eager_median_ms", res_.eager_ms)}});
      say("promotion of " + e.id + " refused at " + (v.value("verified", false) ? std::string("timing") : v.value("stage", "")) +
          refusal_summary(refused));
      continue;
    }
    if (taken_meanwhile()) return ended("exists", "a served record appeared during the search");
    auto r = promoted_record(e, cand.value(), verdict.value());
    if (!r) return fail("building the record: " + r.status().to_string());
    if (Status s = put_record(o_.cache_dir, r.value(), 30000); !s) return fail("storing the record: " + s.to_string());
    const double med = v.value("median_ms", 0.0), emed = v.value("eager_median_ms", res_.eager_ms);
    res_.outcome = "served";
    res_.best_ms = med;
    res_.why = "speedup " + std::to_string(v.at("paired").value("speedup_median", emed / med));
    say("promoted " + e.id + ": " + std::to_string(med * 1e3) + " us vs eager " + std::to_string(emed * 1e3) + " us");
    return res_;
  }
  if (taken_meanwhile()) return ended("exists", "a served record appeared during the search");
  return std::nullopt;
}

// The served record for a promoted candidate, with its provenance, timing and verification.
// The record holds the binary the full gauntlet ran (hash-checked), not a build of its own.
Result<Record> KeySearch::promoted_record(const Evaluation& e, const Candidate& cand, nlohmann::json v) {
  auto bin = verified_binary(v);
  if (!bin) return bin.status();
  v.erase("binary");
  auto rec = record_of_binary(key_, cand.source, cand.launch, std::move(bin.value()));
  if (!rec) return rec.status();
  Record r = std::move(rec.value());
  const double med = v.value("median_ms", 0.0), mad = v.value("mad_ms", 0.0);
  const double emed = v.value("eager_median_ms", res_.eager_ms), emad = v.value("eager_mad_ms", eager_mad_);
  const Search& search = *search_;
  r.meta = {{"provenance", {{"by", "kernelcraft-evolve"}, {"verified", true}, {"at", iso_now()}}},
            {"policy", call_.policy},
            {"candidate", {{"id", e.id}, {"family", e.family}, {"knobs", e.knobs}, {"origin", e.origin},
                           {"parents", e.parents}, {"generation", e.generation}}},
            {"timing", {{"median_ms", med}, {"mad_ms", mad}, {"eager_median_ms", emed}, {"eager_mad_ms", emad},
                        {"speedup", v.at("paired").value("speedup_median", emed / med)},
                        {"speedup_p10", v.at("paired").value("speedup_p10", 0.0)},
                        {"pairs", v.at("paired").value("pairs", 0)}, {"interleaved", true},
                        {"copy_gb_s", v.value("copy_gb_s", 0.0)}}},
            {"verification", v},
            {"search", {{"generations", search.state().generation}, {"evaluated", search.state().tried.size()},
                        {"finish_reason", search.state().finish_reason}, {"elapsed_s", search.state().elapsed_s},
                        {"first_verified_s", search.first_verified_s()}, {"best_found_s", search.best_found_s()},
                        {"refused", attempts_}}}};
  record_verdict_facts(r, v, cand.repeatable);
  if (disabled_) r.meta["disabled_before"] = disabled_->meta.value("disabled", nlohmann::json::object());
  return r;
}

// Nothing beat eager (or nothing passed): remember it so the key is not searched again until the
// runtime, driver or toolkit changes (all part of the key).
EvolveResult KeySearch::eager_best() {
  const Search& search = *search_;
  Record r;
  r.key = key_;
  r.op = op_info(call_.op).aten;
  r.backend = call_.backend;
  r.state = RecordState::kEagerBest;
  r.meta = {{"provenance", {{"by", "kernelcraft-evolve"}, {"at", iso_now()}}},
            {"policy", call_.policy},
            {"eager_median_ms", res_.eager_ms},
            {"best_candidate_ms", res_.best_ms},
            {"search", {{"generations", search.state().generation}, {"evaluated", search.state().tried.size()},
                        {"finish_reason", search.state().finish_reason}, {"refused", attempts_}}}};
  if (disabled_) r.meta["disabled_before"] = disabled_->meta.value("disabled", nlohmann::json::object());
  if (Status s = put_record(o_.cache_dir, r, 30000); !s) return fail("storing eager_best: " + s.to_string());
  res_.outcome = "eager_best";
  res_.why = search.ranked().empty() ? "no candidate passed verification" : "no candidate beat eager beyond the noise";
  say("eager is best: " + res_.why);
  return res_;
}

}  // namespace

EvolveResult evolve_key(const std::string& key, const std::string& job_file, int device, const EvolveOptions& o) {
  return KeySearch(key, job_file, device, o).run();
}

}  // namespace kc::evolve
