// Configuration, declared once: every setting with its environment variable, JSON key and default.
// Sources, later overriding earlier: defaults < JSON file named by KERNELCRAFT_CONFIG < environment
// < torch.ops.kernelcraft.configure(json) at run time. README.md ("Configuration") lists them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace kc {

// How the evaluation children are sandboxed (evolve/verify/sandbox.h): not at all (for debugging), the
// syscall filter for CPU candidates and resource limits for all (the default), or the filter's
// CUDA variant for CUDA candidates too (to be checked on each GPU machine first).
enum class EvolveSandbox { kOff, kCpu, kAll };
const char* to_string(EvolveSandbox m);
// "off" | "cpu" | "all"; nullopt for anything else.
std::optional<EvolveSandbox> parse_evolve_sandbox(const std::string& s);

struct Config {
  bool enabled = true;                 // KERNELCRAFT_DISABLE=1 / "enabled": global on/off switch
  std::vector<std::string> ops;        // KERNELCRAFT_OPS / "ops": intercepted ops (short names)
  std::string cache_dir;               // KERNELCRAFT_CACHE_DIR / "cache_dir"
  bool cache_readonly = false;         // KERNELCRAFT_CACHE_READONLY / "cache_readonly"
  bool cache_shared = false;           // KERNELCRAFT_CACHE_SHARED / "cache_shared": allow a cache
                                       // directory owned by another user or group-writable
                                       // (runtime/cache_dir.h); private (0700, ours) otherwise
  double evolve_memory_share = 0.5;    // KERNELCRAFT_EVOLVE_MEMORY_SHARE / "evolve_memory_share": the
                                       // CPU evaluation child's address-space cap, as a fraction of
                                       // the memory available when it starts (0: no cap)
  EvolveSandbox evolve_sandbox = EvolveSandbox::kCpu;  // KERNELCRAFT_EVOLVE_SANDBOX / "evolve_sandbox":
                                       // off | cpu | all (evolve/verify/sandbox.h)
  std::string miss_log;                // KERNELCRAFT_MISS_LOG / "miss_log": append missed keys here
  std::string trusted_keys;            // KERNELCRAFT_TRUSTED_KEYS / "trusted_keys": bundle-signing
                                       // public keys (.pub files or directories, comma-separated);
                                       // set: cache import takes only bundles signed by one of them
  std::string cxx = "c++";             // KERNELCRAFT_CXX / "cxx": host compiler for CPU kernels
  std::string nvrtc_path;              // KERNELCRAFT_NVRTC / "nvrtc": libnvrtc to dlopen first
  std::string policy = "fp32";         // KERNELCRAFT_PRECISION / "precision": fp32 | tf32 | bf16
  int catch_up_ms = 500;               // KERNELCRAFT_CATCH_UP_MS / "catch_up_ms": how often a serving
                                       // process looks for kernels written by others (0: never)
  int serve_probe_calls = 8;           // KERNELCRAFT_SERVE_PROBE_CALLS / "serve_probe_calls": the first
                                       // calls of a newly served key also run eager, both timed; a
                                       // kernel not faster here is demoted for this process (0: off)
  int shadow_calls = 4;                // KERNELCRAFT_SHADOW_CALLS / "shadow_calls": the first served
                                       // calls of a key in this process also run eager, compared
                                       // (dispatcher/shadow.h); off with cache_readonly
  int shadow_every = 1000;             // KERNELCRAFT_SHADOW_EVERY / "shadow_every": afterwards 1 served
                                       // call in this many on average is compared (0: never)
  bool deterministic_only = false;     // KERNELCRAFT_DETERMINISTIC_ONLY / "deterministic_only": serve
                                       // only kernels the gauntlet saw bitwise deterministic, as
                                       // torch.use_deterministic_algorithms(True) does on its own
  std::string log_level = "warn";      // KERNELCRAFT_LOG_LEVEL / "log_level"
  bool serve_unverified = false;       // KERNELCRAFT_SERVE_UNVERIFIED / "serve_unverified": also serve
                                       // records stored by hand without the gauntlet (cache put)
  // Background evolution (the worker process; evolve/worker/worker.h).
  bool evolve = true;                  // KERNELCRAFT_EVOLVE / "evolve": submit misses to the worker
  std::string worker;                  // KERNELCRAFT_WORKER / "worker": the kernelcraft executable
  double evolve_gpu_share = 0.2;       // KERNELCRAFT_EVOLVE_GPU_SHARE / "evolve_gpu_share": duty cycle
  int evolve_jobs = 1;                 // KERNELCRAFT_EVOLVE_JOBS / "evolve_jobs": keys searched at once
  double evolve_key_budget_s = 600;    // KERNELCRAFT_EVOLVE_KEY_BUDGET_S / "evolve_key_budget_s"
  int evolve_mu = 4;                   // KERNELCRAFT_EVOLVE_MU / "evolve_mu"
  int evolve_lambda = 8;               // KERNELCRAFT_EVOLVE_LAMBDA / "evolve_lambda"
  int evolve_generations = 8;          // KERNELCRAFT_EVOLVE_GENERATIONS / "evolve_generations"
  int evolve_capture_mb = 64;          // KERNELCRAFT_EVOLVE_CAPTURE_MB / "evolve_capture_mb": inputs
                                       // larger than this are not captured (generated instead)
  double evolve_candidate_timeout_s = 180;  // KERNELCRAFT_EVOLVE_CANDIDATE_TIMEOUT_S: a candidate
                                           // (sanitizers included) running longer is killed as hung
  double worker_idle_s = 60;           // KERNELCRAFT_WORKER_IDLE_S / "worker_idle_s": idle worker exits
  int evolve_nice = 10;                // KERNELCRAFT_EVOLVE_NICE / "evolve_nice": the worker's CPU
                                       // priority (nice 0..19; below the user's job by default)
  // Job-wide coordination through a distributed job's c10d store (dispatcher/coordinator.h).
  std::string job_store;               // KERNELCRAFT_JOB_STORE / "job_store": "" (auto: MASTER_ADDR:
                                       // MASTER_PORT when WORLD_SIZE > 1), "off", or host:port
  double job_lease_s = 60;             // KERNELCRAFT_JOB_LEASE_S / "job_lease_s": a claim unrenewed
                                       // this long is taken over by another node
  int job_poll_ms = 1000;              // KERNELCRAFT_JOB_POLL_MS / "job_poll_ms": how often claims
                                       // are renewed and published records read
  int job_store_timeout_ms = 3000;     // KERNELCRAFT_JOB_STORE_TIMEOUT_MS / "job_store_timeout_ms":
                                       // the longest one store call may take before the store is
                                       // given up for the process
  // The LLM proposer (evolve/propose/llm.h): an OpenAI-compatible chat-completions endpoint; off when empty.
  std::string llm_api = "openai";      // KERNELCRAFT_LLM_API / "llm_api": openai | anthropic
  std::string llm_url;                 // KERNELCRAFT_LLM_URL / "llm_url"
  std::string llm_model;               // KERNELCRAFT_LLM_MODEL / "llm_model"
  std::string llm_key_env = "KERNELCRAFT_LLM_KEY";  // KERNELCRAFT_LLM_KEY_ENV / "llm_key_env": the
                                       // variable holding the API key (the key itself is never stored)
};

// One row per setting (JSON key, environment variable, README text), in the order of README.md's
// table; derived from the settings table in config.cpp.
struct ConfigField {
  const char* json_key;
  const char* env;
  const char* help;
};
const std::vector<ConfigField>& config_fields();

// Parses a KERNELCRAFT_OPS-style list: "default", "all", "none", or comma-separated names, where
// "-name" removes and "+name"/"name" adds (relative to "default" when the list starts with +/-).
Result<std::vector<std::string>> parse_op_list(const std::string& text);

// Defaults, then the KERNELCRAFT_CONFIG file, then the environment. Errors in either are logged
// once and the offending setting keeps its previous value.
Config load_config();
// Applies a JSON object on top of `c`; unknown keys and wrong types are kInvalid (c unchanged).
Status apply_json(Config& c, const nlohmann::json& j);
nlohmann::json to_json(const Config& c);

// The evolution settings of `c` as the one object they travel in: from a process's configuration
// to its worker (the worker's --settings, and every job file) and to the CLI's own options. Read
// back in one place, evolve/worker/worker.h apply_evolve_json.
//   {"search": {"mu", "lambda", "max_generations", "key_budget_s"}, "candidate_timeout_s",
//    "gpu_share", "jobs", "memory_share", "llm": {"api", "url", "model", "key_env"}}
nlohmann::json evolution_settings(const Config& c);

}  // namespace kc
