// `kernelcraft worker`, `evolve` and `verify`: the evolution path from the command line.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "evolve/worker/worker.h"
#include "kernel_cache/store.h"
#include "runtime/fsutil.h"
#include "runtime/config.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/log.h"
#include "torch_ops/cli/cli.h"
#include "torch_ops/cli/progress.h"

namespace kc::cli {
namespace {

// Settings shared by worker and evolve, through their one channel (runtime/config.h
// evolution_settings): this process's configuration (env / KERNELCRAFT_CONFIG), then --settings
// (what a training process hands the worker it starts), then single options.
int evolve_options(const Args& args, evolve::EvolveOptions& o) {
  o.cache_dir = args.cache_dir;
  o.self_exe = self_exe();
  if (o.self_exe.empty()) o.self_exe = "kernelcraft";
  if (Status s = evolve::apply_evolve_json(o, evolution_settings(load_config())); !s) return usage_error(s.message());
  if (!args.value("settings").empty()) {
    auto j = nlohmann::json::parse(args.value("settings"), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return usage_error("--settings must be a JSON object");
    if (Status s = evolve::apply_evolve_json(o, j); !s) return usage_error("--settings: " + s.message());
  }
  try {
    if (!args.value("gpu-share").empty()) o.gpu_share = std::stod(args.value("gpu-share"));
    if (!args.value("jobs").empty()) o.jobs = std::stoi(args.value("jobs"));
    if (!args.value("mu").empty()) o.search.mu = std::stoi(args.value("mu"));
    if (!args.value("lambda").empty()) o.search.lambda = std::stoi(args.value("lambda"));
    if (!args.value("generations").empty()) o.search.max_generations = std::stoi(args.value("generations"));
    if (!args.value("budget-s").empty()) o.search.key_budget_s = std::stod(args.value("budget-s"));
  } catch (const std::exception&) {
    return usage_error("a numeric option is not a number");
  }
  if (o.gpu_share <= 0 || o.gpu_share > 1) return usage_error("--gpu-share must be in (0, 1]");
  return kExitOk;
}

int device_of(const Args& args) { return args.value("device").empty() ? 0 : std::atoi(args.value("device").c_str()); }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// "64x1000" -> {64, 1000}
bool parse_shape(const std::string& s, std::vector<int64_t>& out) {
  out.clear();
  for (const auto& part : split(s, 'x')) {
    try {
      size_t used = 0;
      long long v = std::stoll(part, &used);
      if (used != part.size() || v < 0) return false;
      out.push_back(v);
    } catch (const std::exception&) {
      return false;
    }
  }
  return !out.empty();
}

// Calls from --op/--shape(s)/--dtype/--args/--backend, or from --key.
int calls_from_args(const Args& args, std::vector<evolve::OpCall>& calls, bool need_key) {
  const auto parsed_backend = backend_from_name(args.value("backend").empty() ? "cuda" : args.value("backend"));
  if (!parsed_backend) return usage_error("--backend must be cuda or cpu");
  const BackendKind backend = *parsed_backend;
  if (!args.value("key").empty()) {
    auto c = evolve::call_from_key(args.value("key"));
    if (!c) return usage_error(c.status().message());
    calls.push_back(c.value());
    return kExitOk;
  }
  if (args.value("op").empty() || args.value("shape").empty()) return usage_error("give --key KEY, or --op OP and --shape AxB");
  auto op = op_by_name(args.value("op"));
  if (!op) return usage_error("unknown op '" + args.value("op") + "' (kernelcraft ops lists them)");
  const auto parsed = dtype_from_name(args.value("dtype").empty() ? "f32" : args.value("dtype"));
  if (!parsed || (*parsed != DType::kF32 && *parsed != DType::kF64 && *parsed != DType::kF16 && *parsed != DType::kBF16))
    return usage_error("--dtype must be f32, f64, f16 or bf16");
  const DType dt = *parsed;
  nlohmann::json extra = nlohmann::json::object();
  if (!args.value("args").empty()) {
    extra = nlohmann::json::parse(args.value("args"), nullptr, false);
    if (extra.is_discarded() || !extra.is_object()) return usage_error("--args must be a JSON object");
  }
  std::string target;
  if (need_key) {
    auto be = backend_for(backend, device_of(args));
    if (!be) return fail("no device for the key's target: " + be.status().message());
    target = be.value()->target_id();
  }
  for (const auto& s : split(args.value("shape"), ';')) {
    std::vector<int64_t> sizes;
    if (!parse_shape(s, sizes)) return usage_error("bad --shape '" + s + "' (want e.g. 64x1000)");
    auto c = evolve::make_call(*op, sizes, dt, backend, extra);
    if (!c) return usage_error(c.status().message());
    c.value().policy = args.value("precision").empty() ? "fp32" : args.value("precision");
    if (c.value().policy != "fp32" && c.value().policy != "tf32" && c.value().policy != "bf16")
      return usage_error("--precision must be fp32, tf32 or bf16");
    if (need_key) {
      c.value().target = target;
      c.value().key = evolve::call_key(c.value());
    }
    calls.push_back(c.value());
  }
  return kExitOk;
}

}  // namespace

int run_worker_cmd(const Args& args) {
  evolve::EvolveOptions o;
  if (int rc = evolve_options(args, o); rc != kExitOk) return rc;
  double idle = load_config().worker_idle_s;
  if (!args.value("idle-s").empty()) idle = std::atof(args.value("idle-s").c_str());
  set_log_level(LogLevel::kInfo);
  return evolve::run_worker(o, idle);
}

int run_job_check_cmd(const Args& args) {
  evolve::EvolveOptions o;
  if (int rc = evolve_options(args, o); rc != kExitOk) return rc;
  if (args.words.size() < 2) return usage_error("job-check needs job files");
  int bad = 0;
  for (size_t i = 1; i < args.words.size(); ++i) {
    auto r = evolve::check_job_file(o, args.words[i]);
    if (!r) ++bad;
    nlohmann::json j = {{"file", args.words[i]}, {"ok", r.is_ok()}, {"reason", r ? "" : r.status().to_string()}};
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return bad ? kExitFailure : kExitOk;
}

int run_evolve_cmd(const Args& args) {
  evolve::EvolveOptions o;
  if (int rc = evolve_options(args, o); rc != kExitOk) return rc;
  if (args.value("gpu-share").empty()) o.gpu_share = 1.0;   // offline: the GPU is ours
  std::vector<std::string> keys;
  if (!args.value("keys").empty()) {
    std::string text;
    bool ok = false;
    text = read_file(args.value("keys"), &ok);
    if (!ok) return fail("cannot read " + args.value("keys"));
    for (auto& line : split(text, '\n')) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') keys.push_back(line);
    }
  } else {
    std::vector<evolve::OpCall> calls;
    if (int rc = calls_from_args(args, calls, true); rc != kExitOk) return rc;
    for (const auto& c : calls) keys.push_back(c.key);
  }
  if (keys.empty()) return usage_error("no keys to evolve");
  // Progress goes to stderr (a bar on a terminal, lines elsewhere); stdout keeps one result line
  // per key, or the JSON document alone with --json.
  std::unique_ptr<EvolveProgress> bar;
  if (!args.json) {
    bar = std::make_unique<EvolveProgress>(stderr, keys.size());
    o.progress = [&bar](const std::string& s) { bar->line(s); };
    o.on_step = [&bar](const evolve::SearchProgress& p) { bar->step(p); };
  }
  nlohmann::json results = nlohmann::json::array();
  bool all_ok = true;
  for (const auto& k : keys) {
    if (bar) bar->start_key(k);
    evolve::EvolveResult r = evolve::evolve_key(k, "", device_of(args), o);
    results.push_back(r.to_json());
    all_ok = all_ok && (r.outcome == "served" || r.outcome == "eager_best" || r.outcome == "exists");
    if (!bar) continue;
    bar->end_key(r);
    char row[160];
    std::snprintf(row, sizeof row, "%-10s %8.2f us eager %8.2f us best  ", r.outcome.c_str(), r.eager_ms * 1e3,
                  r.best_ms * 1e3);
    if (isatty(fileno(stdout)) && isatty(fileno(stderr))) bar->line(row + k);   // one screen: above the bar
    else std::printf("%s%s\n", row, k.c_str());
  }
  bar.reset();
  if (args.json) print_json(results, true);
  return all_ok ? kExitOk : kExitFailure;
}

// The recorded search of one key: every candidate tried, its verdict and time (resumable state).
int run_search_state_cmd(const Args& args) {
  if (args.words.size() != 2) return usage_error("search-state takes one KEY");
  if (!path_exists(args.cache_dir + "/CURRENT")) return fail("no cache at " + args.cache_dir);
  auto st = Store::open(args.cache_dir, Store::Mode::kReadOnly);
  if (!st) return fail(st.status().to_string());
  auto v = st.value()->get(search_state_key(args.words[1]));
  if (!v) return fail("no search recorded for that key");
  auto j = nlohmann::json::parse(v.value(), nullptr, false);
  if (j.is_discarded()) return fail("the search state does not parse");
  if (args.json) {
    print_json(j, true);
    return kExitOk;
  }
  std::printf("generation %d, %s%s\n", j.value("generation", 0), j.value("finished", false) ? "finished: " : "running",
              j.value("finish_reason", "").c_str());
  for (const auto& e : j.value("tried", nlohmann::json::array()))
    std::printf("  g%-2d %-9s %-10s %10.2f us  %s\n", e.value("generation", 0), e.value("verdict", "").c_str(),
                e.value("stage", "").c_str(), e.value("median_ms", 0.0) * 1e3, e.value("id", "").c_str());
  return kExitOk;
}

namespace {

// The gauntlet for each call, failing fast across calls: {"verified", "stage", "calls": [verdicts
// with "shape"], and for a rejection the rejecting stage's "summary" and "evidence"}.
Result<nlohmann::json> verify_calls(const Args& args, const evolve::EvolveOptions& o,
                                    const std::vector<evolve::OpCall>& calls, const std::string& source,
                                    const nlohmann::json& launch) {
  nlohmann::json out = {{"verified", true}, {"stage", ""}, {"calls", nlohmann::json::array()}};
  for (const auto& c : calls) {
    auto v = evolve::verify_kernel(evolve::to_json(c), source, launch, device_of(args), o);
    if (!v) return v.status();
    nlohmann::json r = v.value();
    std::string shape;
    for (auto s : c.inputs.front().sizes) shape += (shape.empty() ? "" : "x") + std::to_string(s);
    r["shape"] = shape;
    out["calls"].push_back(r);
    if (!r.value("verified", false)) {
      out["verified"] = false;
      out["stage"] = r.value("stage", "");
      // The rejecting stage's summary and evidence, up front for scripts.
      for (const auto& s : r.value("stages", nlohmann::json::array()))
        if (s.value("outcome", "") == "rejected") {
          out["summary"] = s.value("summary", "");
          out["evidence"] = s.value("evidence", nlohmann::json::object());
        }
      break;
    }
  }
  return out;
}

// Prints verify's result (JSON or the stage table) and returns its exit code.
int report_verdict(const Args& args, const nlohmann::json& out) {
  if (args.json) {
    nlohmann::json shown = out;   // without the verified binaries (base64) a pass carries
    for (auto& r : shown["calls"]) r.erase("binary");
    print_json(shown, true);
  } else {
    for (const auto& r : out["calls"]) {
      std::printf("shape %s\n", r.value("shape", "").c_str());
      for (const auto& s : r.value("stages", nlohmann::json::array()))
        std::printf("  %-10s %-9s %8.0f ms  %s\n", s.value("name", "").c_str(), s.value("outcome", "").c_str(),
                    s.value("millis", 0.0), s.value("summary", "").c_str());
      if (r.value("verified", false))
        std::printf("  timing: %.2f us vs eager %.2f us\n", r.value("median_ms", 0.0) * 1e3,
                    r.value("eager_median_ms", 0.0) * 1e3);
      if (r.contains("peak_rss_mb")) std::printf("  evaluation child peak RSS: %d MiB\n", r.value("peak_rss_mb", 0));
    }
    if (out["verified"].get<bool>()) std::printf("VERIFIED\n");
    else {
      std::printf("REJECTED at %s: %s\n", out.value("stage", "").c_str(), out.value("summary", "").c_str());
      if (out.contains("evidence")) std::printf("evidence: %s\n", out["evidence"].dump().substr(0, 2000).c_str());
    }
  }
  if (out["verified"].get<bool>()) return kExitOk;
  // The one stderr line every failing command gives; the details are on stdout.
  return fail("rejected at " + out.value("stage", std::string("?")) + ": " + out.value("summary", std::string()));
}

int infrastructure_error(const Args& args, const Status& s) {
  if (args.json) print_json({{"verified", false}, {"stage", "infrastructure"}, {"error", s.to_string()}}, true);
  return fail("verify could not run: " + s.to_string()) + 1;   // 2: not the kernel's fault
}

}  // namespace

int run_verify_cmd(const Args& args) {
  evolve::EvolveOptions o;
  if (int rc = evolve_options(args, o); rc != kExitOk) return rc;
  if (args.value("source").empty() || args.value("launch").empty()) return usage_error("verify needs --source and --launch");
  bool ok_source = false, ok_launch = false;
  std::string source = read_file(args.value("source"), &ok_source);
  std::string launch_text = read_file(args.value("launch"), &ok_launch);
  if (!ok_source) return usage_error("cannot read " + args.value("source"));
  if (!ok_launch) return usage_error("cannot read " + args.value("launch"));
  nlohmann::json launch = nlohmann::json::parse(launch_text, nullptr, false);
  if (launch.is_discarded()) return usage_error(args.value("launch") + " is not valid JSON");
  std::vector<evolve::OpCall> calls;
  if (int rc = calls_from_args(args, calls, false); rc != kExitOk) return rc;
  auto out = verify_calls(args, o, calls, source, launch);
  if (!out) return infrastructure_error(args, out.status());
  return report_verdict(args, out.value());
}

int verify_for_put(const Args& args, const std::string& key, const std::string& source,
                   const nlohmann::json& launch, nlohmann::json& verdict) {
  evolve::EvolveOptions o;
  if (int rc = evolve_options(args, o); rc != kExitOk) return rc;
  auto call = evolve::call_from_key(key);
  if (!call) return usage_error("cannot verify for this key: " + call.status().message());
  auto out = verify_calls(args, o, {call.value()}, source, launch);
  if (!out) return infrastructure_error(args, out.status());
  verdict = out.value();
  if (verdict.value("verified", false)) return kExitOk;
  return report_verdict(args, verdict);
}

}  // namespace kc::cli

namespace kc::cli {

Result<nlohmann::json> reverify_for_import(const Args& args, const std::string& key, const std::string& source,
                                           const nlohmann::json& launch) {
  evolve::EvolveOptions o;
  if (int rc = evolve_options(args, o); rc != kExitOk) return Status::error(Code::kInvalid, "bad options");
  auto call = evolve::call_from_key(key);
  if (!call) return Status::error(Code::kInvalid, "cannot verify for this key: " + call.status().message());
  auto out = verify_calls(args, o, {call.value()}, source, launch);
  if (!out) return Status::error(out.status().code(), "verify could not run: " + out.status().message());
  const nlohmann::json& v = out.value();
  if (!v.value("verified", false))
    return Status::error(Code::kRejected, v.value("stage", std::string("?")) + ": " + v.value("summary", std::string()));
  const nlohmann::json& call0 = v["calls"].at(0);
  // The evidence an evolved record keeps (as cache put --verify stores it).
  return nlohmann::json{{"stages", call0.value("stages", nlohmann::json::array())},
                        {"median_ms", call0.value("median_ms", 0.0)},
                        {"eager_median_ms", call0.value("eager_median_ms", 0.0)},
                        {"copy_gb_s", call0.value("copy_gb_s", 0.0)}};
}

}  // namespace kc::cli
