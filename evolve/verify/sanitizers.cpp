// The gauntlet's sanitizer stage; see sanitizers.h.
#include "evolve/verify/sanitizers.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "evolve/verify/memory_cap.h"
#include "runtime/config.h"
#include "runtime/cpu_backend.h"
#include "runtime/fsutil.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"

namespace kc::evolve {
namespace {

std::string find_sanitizer(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* e = std::getenv("KERNELCRAFT_SANITIZER")) return e;
  if (const char* p = std::getenv("PATH")) {
    std::string path = p;
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      std::string cand = dir + "/compute-sanitizer";
      if (!dir.empty() && access(cand.c_str(), X_OK) == 0) return cand;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  for (const char* c : {"/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda/compute-sanitizer/compute-sanitizer"})
    if (access(c, X_OK) == 0) return c;
  return "";
}

// A log's head, bounded for the evidence.
std::string read_text(const std::string& p, size_t limit) {
  std::string s = read_file(p);
  return s.size() > limit ? s.substr(0, limit) + "..." : s;
}

// The first line of a sanitizer report that says what went wrong (skipping banners and summaries);
// compute-sanitizer prefixes report lines with "=========".
std::string first_error_line(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    std::string body = line.rfind("========= ", 0) == 0 ? line.substr(10) : line;
    if (body.size() < 4 || body.find("COMPUTE-SANITIZER") != std::string::npos ||
        body.find("ERROR SUMMARY") != std::string::npos)
      continue;
    if (body.find("rror") != std::string::npos || body.find("Invalid") != std::string::npos ||
        body.find("hazard") != std::string::npos || body.find("ERROR") != std::string::npos ||
        body.find("Uninitialized") != std::string::npos || body.find("Barrier") != std::string::npos) {
      // The source line (kernels are compiled with line info): "... in kernel.cu:12", or
      // AddressSanitizer's frame "in kc_entry /path/kernel.cpp:8".
      size_t at = text.find("kernel.cu:", pos);
      if (at == std::string::npos) at = text.find("kernel.cpp:", pos);
      if (at != std::string::npos) {
        size_t end = text.find_first_of(" \n", at);
        body += " (" + text.substr(at, end == std::string::npos ? std::string::npos : end - at) + ")";
      }
      return body;
    }
  }
  return text.substr(0, text.find('\n'));
}

// The host compiler's libasan.so, or "" (asked once).
std::string asan_runtime() {
  static const std::string path = [] {
    std::string out = owned_temp_path("asan-path");
    ProcessOptions po;
    po.timeout_s = 20;
    po.output_path = out;
    std::vector<std::string> argv = split_command(load_config().cxx);
    argv.push_back("-print-file-name=libasan.so");
    auto r = run_process(argv, po);
    std::string p = read_text(out, 4096);
    unlink(out.c_str());
    while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
    if (!r || !r.value().ok() || p.empty() || p[0] != '/' || access(p.c_str(), R_OK) != 0) return std::string();
    return p;
  }();
  return path;
}

}  // namespace

namespace {

// What to run: the kernel binary the runner loads (an ASan build on the CPU), the runners'
// environment, one argv per tool; `skipped` says why nothing can run here.
struct SanitizerPlan {
  std::string bin;
  std::vector<std::string> env, names;
  std::vector<std::vector<std::string>> runs;
  std::string skipped;
};

SanitizerPlan plan_sanitizers(const SanitizerRun& in, const GauntletOptions& opt, const std::string& dir) {
  SanitizerPlan p;
  p.bin = in.binary;
  if (in.backend == BackendKind::kCuda) {
    std::string san = find_sanitizer(opt.sanitizer);
    if (san.empty()) p.skipped = "compute-sanitizer not found (set KERNELCRAFT_SANITIZER)";
    for (const auto& tool : opt.sanitizer_tools) {
      std::vector<std::string> a = {san, "--tool", tool, "--error-exitcode", "86", "--print-limit", "4"};
      if (tool == "memcheck") a.insert(a.end(), {"--leak-check", "no"});
      if (tool == "racecheck") a.insert(a.end(), {"--racecheck-report", "hazard"});
      a.insert(a.end(), {opt.sanitize_exe, dir});
      p.runs.push_back(a);
      p.names.push_back(tool);
    }
  } else {
    auto asan = cpu_compile(in.source, {"-fsanitize=address", "-fno-omit-frame-pointer", "-g"});
    if (!asan) {
      p.skipped = "AddressSanitizer build failed: " + asan.status().message().substr(0, 200);
      return p;
    }
    p.bin = asan.value().binary;
    // The runner is not built with ASan; its runtime is preloaded for the kernel's sake.
    std::string rt = asan_runtime();
    if (rt.empty()) p.skipped = "no AddressSanitizer runtime (libasan.so) for the host compiler";
    // ASan reserves terabytes of shadow, so no address-space cap fits the runner; its own limit on
    // resident memory bounds a kernel that allocates too much.
    std::string opts = "ASAN_OPTIONS=detect_leaks=0:exitcode=86:abort_on_error=0:verify_asan_link_order=0";
    if (opt.sanitizer_rss_mb > 0) opts += ":hard_rss_limit_mb=" + std::to_string(opt.sanitizer_rss_mb);
    p.env = {opts, "LD_PRELOAD=" + rt};
    p.runs.push_back({opt.sanitize_exe, dir});
    p.names.push_back("asan");
  }
  if (p.skipped.empty() && (opt.sanitize_exe.empty() || access(opt.sanitize_exe.c_str(), X_OK) != 0))
    p.skipped = "kernelcraft-sanitize not found";
  return p;
}

// Every runner loads the inputs onto the device and allocates the outputs, and the evaluation
// child still holds its own copies. Past this many input bytes the tools run one at a time, and
// each gets sanitizer_timeout_s plus kSanitizerSecondsPerGiB for every GiB: at the size of public
// single-op benchmarks (4-8 GiB a tensor, 2026-12-06 on an H100) the concurrent runs refused two
// of the three keys that reached them, and cumsum (32768, 32768) passed one at a time.
constexpr int64_t kSequentialSanitizerBytes = int64_t{1} << 30;
constexpr double kSanitizerSecondsPerGiB = 60;

int64_t input_bytes(const SanitizerRun& in) {
  int64_t n = 0;
  for (const auto& b : in.inputs) n += static_cast<int64_t>(b.size());
  return n;
}

// The tools run concurrently (each in its own process), wall time the slowest one's; one after
// another for large inputs (above).
std::vector<Result<ProcessResult>> run_tools(const SanitizerPlan& p, const std::vector<std::string>& logs,
                                             const SanitizerRun& in, const GauntletOptions& opt) {
  std::vector<Result<ProcessResult>> results(p.runs.size(), Status::error(Code::kUnavailable, "not run"));
  const int64_t bytes = input_bytes(in);
  const bool one_at_a_time = bytes > kSequentialSanitizerBytes;
  const double timeout = opt.sanitizer_timeout_s + kSanitizerSecondsPerGiB * static_cast<double>(bytes) / (1 << 30);
  AddressSpaceLift lift;   // the runners start without the evaluation child's memory cap
  auto tool = [&](size_t k) {
    ProcessOptions po;
    po.timeout_s = timeout;
    po.output_path = logs[k];
    po.env = p.env;
    po.env.push_back("KERNELCRAFT_DEVICE=" + std::to_string(in.device));
    results[k] = run_process(p.runs[k], po);
  };
  if (one_at_a_time) {
    for (size_t k = 0; k < p.runs.size(); ++k) tool(k);
    return results;
  }
  std::vector<std::thread> pool;
  for (size_t k = 0; k < p.runs.size(); ++k) pool.emplace_back(tool, k);
  for (auto& t : pool) t.join();
  return results;
}

}  // namespace

StageReport run_sanitizers(const SanitizerRun& in, const GauntletOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  StageReport s{StageId::kSanitizer, Outcome::kPassed, "", nlohmann::json::object(), 0};
  auto done = [&](Outcome outcome, const std::string& summary) {
    s.outcome = outcome;
    s.summary = summary;
    s.millis = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return s;
  };
  std::string dir = opt.work_dir.empty() ? owned_temp_path("sanitize") : opt.work_dir;
  make_dirs(dir);
  RemoveAtScopeEnd cleanup(dir);   // rejects return early; a crash is left to sweep_stale_temp()
  const SanitizerPlan plan = plan_sanitizers(in, opt, dir);
  if (!plan.skipped.empty()) return done(Outcome::kSkipped, plan.skipped);
  write_file(dir + "/call.json", in.call.dump());
  write_file(dir + "/launch.json", in.launch.dump());
  write_file(dir + "/kernel.bin", plan.bin);
  for (size_t k = 0; k < in.inputs.size(); ++k)
    if (!in.inputs[k].empty()) write_file(dir + "/in" + std::to_string(k) + ".bin", in.inputs[k]);
  std::vector<std::string> logs;
  for (const auto& n : plan.names) logs.push_back(dir + "/" + n + ".log");
  const auto results = run_tools(plan, logs, in, opt);
  nlohmann::json tools = nlohmann::json::array();
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    const std::string& tool = plan.names[k];
    std::string text = read_text(logs[k], 6000);
    if (!results[k]) {
      tools.push_back({{"tool", tool}, {"result", results[k].status().to_string()}});
      s.evidence["tools"] = tools;
      return done(Outcome::kRejected, tool + ": " + results[k].status().message());
    }
    const ProcessResult& r = results[k].value();
    const bool clean = r.ok();
    tools.push_back({{"tool", tool}, {"exit", r.exit_code}, {"signal", r.signal},
                     {"millis", r.millis}, {"output", clean ? std::string() : text}});
    if (!clean) {
      s.evidence["tools"] = tools;
      return done(Outcome::kRejected, tool + ": " + first_error_line(text));
    }
  }
  s.evidence["tools"] = tools;
  return done(Outcome::kPassed, "clean");
}

}  // namespace kc::evolve
