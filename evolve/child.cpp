// The evaluation child; protocol in child.h.
#include "evolve/child.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <torch/csrc/jit/serialization/pickle.h>

#include "evolve/gauntlet.h"
#include "evolve/memory_cap.h"
#include "runtime/fsutil.h"
#include "runtime/log.h"
#include "runtime/temp_files.h"
#include "runtime/worker_client.h"

namespace kc::evolve {
namespace {

void say(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

Result<std::vector<at::Tensor>> unpickle_inputs(const std::string& bytes) {
  std::vector<at::Tensor> out;
  if (bytes.empty()) return out;
  try {
    at::IValue v = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
    if (!v.isTuple()) return Status::error(Code::kCorrupt, "captured inputs are not a tuple");
    for (const auto& e : v.toTupleRef().elements()) out.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
  } catch (const std::exception& e) {
    return Status::error(Code::kCorrupt, std::string("captured inputs: ") + e.what());
  }
  return out;
}

}  // namespace

int eval_child_main(int argc, char** argv) {
  std::string job_path, call_path;
  int device = 0;
  for (int i = 0; i + 1 < argc; ++i) {
    std::string a = argv[i];
    if (a == "--job") job_path = argv[++i];
    else if (a == "--call") call_path = argv[++i];
    else if (a == "--device") device = std::atoi(argv[++i]);
    else if (a == "--address-space-mb") {
      // Before any tensor exists: a key that outgrows the cap fails an allocation here (one
      // verdict), never the host. CPU children only (memory_cap.h says why).
      const int64_t cap = static_cast<int64_t>(std::atoll(argv[++i])) << 20;
      if (!limit_address_space(cap)) log(LogLevel::kWarn, "eval-child: cannot set RLIMIT_AS");
    }
  }
  OpCall call;
  std::vector<at::Tensor> captured;
  if (!job_path.empty()) {
    auto job = read_job(job_path);
    if (!job) return say({{"fatal", job.status().to_string()}}), 2;
    auto c = call_from_key(job.value().key);
    if (!c) return say({{"fatal", c.status().to_string()}}), 2;
    call = c.value();
    auto in = unpickle_inputs(job.value().inputs);
    if (in) captured = std::move(in.value());
    else log(LogLevel::kWarn, in.status().to_string());
  } else if (!call_path.empty()) {
    std::ifstream f(call_path);
    auto j = nlohmann::json::parse(f, nullptr, false);
    if (j.is_discarded()) return say({{"fatal", "call file does not parse"}}), 2;
    auto c = call_from_json(j);
    if (!c) return say({{"fatal", c.status().to_string()}}), 2;
    call = c.value();
  } else {
    return say({{"fatal", "eval-child needs --job or --call"}}), 2;
  }
  GauntletOptions o;
  std::string current_id;   // the candidate being evaluated, for progress lines
  o.progress = [&current_id](const nlohmann::json& where) { say({{"id", current_id}, {"at", where}}); };
  const std::string exe = self_exe();
  o.sanitize_exe = exe.substr(0, exe.rfind('/') + 1) + "kernelcraft-sanitize";
  o.work_dir = owned_temp_path("sanitize");
  auto g = Gauntlet::create(call, device, std::move(captured), o);
  if (!g) return say({{"fatal", g.status().to_string()}}), 2;
  auto eager = g.value()->eager_timing();
  if (!eager) return say({{"fatal", "eager timing: " + eager.status().to_string()}}), 2;
  say({{"ready", true},
       {"eager", {{"median_ms", eager.value().median_ms}, {"mad_ms", eager.value().mad_ms},
                  {"p10_ms", eager.value().p10_ms}, {"p90_ms", eager.value().p90_ms}, {"reps", eager.value().reps}}},
       {"sets", g.value()->set_names()}, {"call", to_json(g.value()->call())}});
  std::string line;
  while (std::getline(std::cin, line)) {
    auto req = nlohmann::json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object()) continue;
    const std::string id = req.value("id", "");
    current_id = id;
    Verdict v = g.value()->run(req.value("source", ""), req.value("launch", nlohmann::json::object()),
                               req.value("mode", "search"), req.value("set", "normal"));
    const bool lost = g.value()->context_lost();
    // context_lost tells the parent not to send more: this process exits right after the answer.
    // The child's own peak resident memory so far (the memory cap's evidence; docs/PERF.md).
    struct rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    say({{"id", id}, {"verdict", v.to_json()}, {"context_lost", lost}, {"peak_rss_mb", ru.ru_maxrss / 1024}});
    // After a device fault the context is gone; the parent starts a fresh child.
    if (lost) return 3;
  }
  return 0;
}

}  // namespace kc::evolve
