// The evaluation child; protocol in child.h.
#include "evolve/worker/child.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <torch/csrc/jit/serialization/pickle.h>

#include "evolve/verify/broker.h"
#include "evolve/verify/gauntlet.h"
#include "evolve/verify/memory_cap.h"
#include "evolve/verify/sandbox.h"
#include "kernel_cache/bundle_trust.h"
#include "runtime/config.h"
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

struct ChildArgs {
  std::string job_path, call_path;
  int device = 0;
  int64_t address_space_mb = 0;   // the memory cap (memory_cap.h), 0: none
  int64_t cpu_limit_s = 0;        // RLIMIT_CPU for the candidates' part of this child's life (sandbox.h)
};

ChildArgs parse_args(int argc, char** argv) {
  ChildArgs a;
  for (int i = 0; i + 1 < argc; ++i) {
    std::string k = argv[i];
    if (k == "--job") a.job_path = argv[++i];
    else if (k == "--call") a.call_path = argv[++i];
    else if (k == "--device") a.device = std::atoi(argv[++i]);
    else if (k == "--address-space-mb") a.address_space_mb = std::atoll(argv[++i]);
    else if (k == "--cpu-limit-s") a.cpu_limit_s = std::atoll(argv[++i]);
  }
  return a;
}

// The call, and a job's pickled inputs (unpickled later: torch is kept idle until the broker is forked).
struct Loaded {
  OpCall call;
  std::string pickled_inputs;
};

Result<Loaded> load_call(const ChildArgs& a) {
  Loaded out;
  if (!a.job_path.empty()) {
    auto job = read_job(a.job_path);
    if (!job) return job.status();
    auto c = call_from_key(job.value().key);
    if (!c) return c.status();
    out.call = c.value();
    out.pickled_inputs = std::move(job.value().inputs);
    return out;
  }
  if (a.call_path.empty()) return Status::error(Code::kInvalid, "eval-child needs --job or --call");
  std::ifstream f(a.call_path);
  auto j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return Status::error(Code::kInvalid, "call file does not parse");
  auto c = call_from_json(j);
  if (!c) return c.status();
  out.call = c.value();
  return out;
}

}  // namespace

int eval_child_main(int argc, char** argv) {
  const ChildArgs a = parse_args(argc, argv);
  // Before any tensor exists: a key that outgrows the cap fails an allocation here (one verdict),
  // never the host. CPU children only (memory_cap.h says why).
  if (a.address_space_mb > 0 && !limit_address_space(a.address_space_mb << 20))
    log(LogLevel::kWarn, "eval-child: cannot set RLIMIT_AS");
  auto loaded = load_call(a);
  if (!loaded) return say({{"fatal", loaded.status().to_string()}}), 2;
  const OpCall& call = loaded.value().call;
  GauntletOptions o;
  std::string current_id;   // the candidate being evaluated, for progress lines
  o.progress = [&current_id](const nlohmann::json& where) { say({{"id", current_id}, {"at", where}}); };
  const std::string exe = self_exe();
  o.sanitize_exe = exe.substr(0, exe.rfind('/') + 1) + "kernelcraft-sanitize";
  o.work_dir = owned_temp_path("sanitize");
  // AddressSanitizer's resident memory: the cap plus its shadow and quarantine.
  if (a.address_space_mb > 0) o.sanitizer_rss_mb = a.address_space_mb + 2048;
  SandboxPolicy policy = sandbox_policy(load_config().evolve_sandbox, call.backend == BackendKind::kCuda, a.cpu_limit_s);
  // The sanitizer stage hands the runner each input as a file (a 256 MiB key died of SIGXFSZ
  // there under the fixed 64 MiB limit).
  if (policy.file_bytes > 0) policy.file_bytes = sandbox_file_bytes(call);
  std::unique_ptr<Broker> broker;
  if (policy.filter) {
    // Forked now, while this process has one thread (torch starts its pools on first use).
    auto b = Broker::start(o);
    if (!b) return say({{"fatal", "sandbox: " + b.status().to_string()}}), 2;
    broker = std::move(b.value());
    o.broker = broker.get();
    policy.lock_address_space = true;   // the sanitizer runs, which start uncapped, are the broker's
  }
  std::vector<at::Tensor> captured;
  if (auto in = unpickle_inputs(loaded.value().pickled_inputs)) captured = std::move(in.value());
  else log(LogLevel::kWarn, in.status().to_string());
  auto g = Gauntlet::create(call, a.device, std::move(captured), o);
  if (!g) return say({{"fatal", g.status().to_string()}}), 2;
  auto eager = g.value()->eager_timing();
  if (!eager) return say({{"fatal", "eager timing: " + eager.status().to_string()}}), 2;
  // Setup was this program's own code; from here on candidates run, so the sandbox closes.
  nlohmann::json sandbox = policy.to_json();
  if (Status s = apply_sandbox(policy); !s) {
    log(LogLevel::kWarn, "evaluation sandbox: " + s.message() + "; candidates run under resource limits only");
    sandbox["filter"] = false;
    sandbox["filter_writes"] = false;
    sandbox["why"] = s.message();
  }
  say({{"ready", true},
       {"eager", {{"median_ms", eager.value().median_ms}, {"mad_ms", eager.value().mad_ms},
                  {"p10_ms", eager.value().p10_ms}, {"p90_ms", eager.value().p90_ms}, {"reps", eager.value().reps}}},
       {"sets", g.value()->set_names()}, {"resident", g.value()->sets_resident()}, {"call", to_json(g.value()->call())}, {"sandbox", sandbox}});
  std::string line;
  while (std::getline(std::cin, line)) {
    auto req = nlohmann::json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object()) continue;
    const std::string id = req.value("id", "");
    current_id = id;
    const Mode mode = mode_from_name(req.value("mode", "")).value_or(Mode::kSearch);
    Verdict v = g.value()->run(req.value("source", ""), req.value("launch", nlohmann::json::object()), mode,
                               req.value("set", "normal"));
    const bool lost = g.value()->context_lost();
    // context_lost tells the parent not to send more: this process exits right after the answer.
    // The child's own peak resident memory so far (the memory cap's evidence; docs/PERF.md).
    struct rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::json vj = v.to_json();
    // A full-mode pass hands back the binary it verified, for the parent to store (hash-checked).
    if (mode == Mode::kFull && v.verified) vj["binary"] = to_base64(v.binary);
    say({{"id", id}, {"verdict", vj}, {"context_lost", lost}, {"peak_rss_mb", ru.ru_maxrss / 1024}});
    // After a device fault or the broker's loss the parent starts a fresh child.
    if (lost) return 3;
  }
  return 0;
}

}  // namespace kc::evolve
