// Configuration: defaults, the KERNELCRAFT_CONFIG JSON file, then KERNELCRAFT_* environment variables.
#include "runtime/config.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/log.h"
#include "runtime/ops.h"

namespace kc {

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> f = {
      {"enabled", "KERNELCRAFT_DISABLE", "global switch; KERNELCRAFT_DISABLE=1 turns interception off"},
      {"ops", "KERNELCRAFT_OPS", "intercepted ops: default | all | none | list, e.g. \"-gelu\" or \"relu,softmax\""},
      {"cache_dir", "KERNELCRAFT_CACHE_DIR", "cache directory (default ~/.cache/kernelcraft)"},
      {"cache_readonly", "KERNELCRAFT_CACHE_READONLY", "serve a shipped cache without ever writing it"},
      {"cache_shared", "KERNELCRAFT_CACHE_SHARED",
       "allow a cache directory owned by another user or writable by group/others (default: private, 0700)"},
      {"evolve_memory_share", "KERNELCRAFT_EVOLVE_MEMORY_SHARE",
       "CPU evaluation child's memory cap as a fraction of available memory (0..1; 0: no cap)"},
      {"evolve_sandbox", "KERNELCRAFT_EVOLVE_SANDBOX",
       "evaluation sandbox: cpu (syscall filter for CPU candidates, limits for all) | all (CUDA too) | off"},
      {"serve_unverified", "KERNELCRAFT_SERVE_UNVERIFIED",
       "also serve kernels stored by hand without verification (cache put, put_kernel)"},
      {"miss_log", "KERNELCRAFT_MISS_LOG", "file to which each newly missed key is appended (pre-warming)"},
      {"trusted_keys", "KERNELCRAFT_TRUSTED_KEYS",
       "comma-separated bundle-signing public keys (.pub files or directories of them); when set, cache import "
       "accepts only bundles signed by one of them"},
      {"cxx", "KERNELCRAFT_CXX", "host C++ compiler for CPU kernels"},
      {"nvrtc", "KERNELCRAFT_NVRTC", "path of libnvrtc to load before the usual search"},
      {"precision", "KERNELCRAFT_PRECISION", "precision policy: fp32 | tf32 | bf16 (part of the key)"},
      {"catch_up_ms", "KERNELCRAFT_CATCH_UP_MS", "ms between looks for kernels written by others (0: never)"},
      {"serve_probe_calls", "KERNELCRAFT_SERVE_PROBE_CALLS",
       "first calls of a newly served key timed against eager; slower kernels are demoted here (0: off)"},
      {"shadow_calls", "KERNELCRAFT_SHADOW_CALLS",
       "first served calls of a key also run eager and are compared; a mismatch disables the record everywhere (0: off)"},
      {"shadow_every", "KERNELCRAFT_SHADOW_EVERY",
       "after those, 1 served call in this many (on average) is compared the same way (0: never)"},
      {"deterministic_only", "KERNELCRAFT_DETERMINISTIC_ONLY",
       "serve only kernels the gauntlet saw bitwise deterministic (as under torch.use_deterministic_algorithms)"},
      {"log_level", "KERNELCRAFT_LOG_LEVEL", "debug | info | warn | error | off"},
      {"evolve", "KERNELCRAFT_EVOLVE", "start background evolution for missed keys (0 to turn off)"},
      {"worker", "KERNELCRAFT_WORKER", "the kernelcraft executable the worker runs as (default: next to the library)"},
      {"evolve_gpu_share", "KERNELCRAFT_EVOLVE_GPU_SHARE", "fraction of wall time the worker may evaluate (0.01..1)"},
      {"evolve_jobs", "KERNELCRAFT_EVOLVE_JOBS", "keys the worker searches concurrently"},
      {"evolve_key_budget_s", "KERNELCRAFT_EVOLVE_KEY_BUDGET_S", "wall-clock seconds per key's search"},
      {"evolve_mu", "KERNELCRAFT_EVOLVE_MU", "parents kept per generation"},
      {"evolve_lambda", "KERNELCRAFT_EVOLVE_LAMBDA", "children per generation"},
      {"evolve_generations", "KERNELCRAFT_EVOLVE_GENERATIONS", "generation limit per key"},
      {"evolve_capture_mb", "KERNELCRAFT_EVOLVE_CAPTURE_MB", "largest captured inputs per job, MiB (0: never capture)"},
      {"evolve_candidate_timeout_s", "KERNELCRAFT_EVOLVE_CANDIDATE_TIMEOUT_S", "seconds before a candidate counts as hung"},
      {"worker_idle_s", "KERNELCRAFT_WORKER_IDLE_S", "seconds an idle worker waits for jobs before exiting"},
      {"evolve_nice", "KERNELCRAFT_EVOLVE_NICE", "the worker's nice level, 0..19 (10: below the user's job)"},
      {"llm_api", "KERNELCRAFT_LLM_API", "the LLM endpoint's API: openai (chat completions) | anthropic (messages)"},
      {"llm_url", "KERNELCRAFT_LLM_URL", "OpenAI-compatible chat-completions URL for the LLM proposer (off when empty)"},
      {"llm_model", "KERNELCRAFT_LLM_MODEL", "model name sent to the LLM endpoint"},
      {"llm_key_env", "KERNELCRAFT_LLM_KEY_ENV", "environment variable holding the LLM API key"},
  };
  return f;
}

namespace {

std::vector<std::string> default_ops() {
  std::vector<std::string> v;
  for (const auto& o : all_ops())
    if (o.default_on) v.push_back(o.name);
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
  }
  return out;
}

bool valid_policy(const std::string& p) { return p == "fp32" || p == "tf32" || p == "bf16"; }
bool valid_llm_api(const std::string& a) { return a == "openai" || a == "anthropic"; }
bool valid_level(const std::string& l) {
  return l == "debug" || l == "info" || l == "warn" || l == "error" || l == "off";
}

}  // namespace

const char* to_string(EvolveSandbox m) {
  switch (m) {
    case EvolveSandbox::kOff: return "off";
    case EvolveSandbox::kCpu: return "cpu";
    case EvolveSandbox::kAll: return "all";
  }
  return "cpu";
}

std::optional<EvolveSandbox> parse_evolve_sandbox(const std::string& s) {
  for (EvolveSandbox m : {EvolveSandbox::kOff, EvolveSandbox::kCpu, EvolveSandbox::kAll})
    if (s == to_string(m)) return m;
  return std::nullopt;
}

Result<std::vector<std::string>> parse_op_list(const std::string& text) {
  std::vector<std::string> items = split(text, ',');
  std::vector<std::string> out;
  if (items.empty()) return Status::error(Code::kInvalid, "empty op list");
  bool relative = items[0][0] == '+' || items[0][0] == '-';
  if (relative) out = default_ops();
  for (const auto& it : items) {
    if (it == "default") { out = default_ops(); continue; }
    if (it == "none") { out.clear(); continue; }
    if (it == "all") {
      out.clear();
      for (const auto& o : all_ops()) out.push_back(o.name);
      continue;
    }
    bool remove = it[0] == '-';
    std::string name = (it[0] == '-' || it[0] == '+') ? it.substr(1) : it;
    auto id = op_by_name(name);
    if (!id) return Status::error(Code::kInvalid, "unknown op '" + name + "' (see `kernelcraft ops`)");
    std::string canon = op_info(*id).name;
    auto pos = std::find(out.begin(), out.end(), canon);
    if (remove) {
      if (pos != out.end()) out.erase(pos);
    } else if (pos == out.end()) {
      out.push_back(canon);
    }
  }
  return out;
}

Status apply_json(Config& c, const nlohmann::json& j) {
  if (!j.is_object()) return Status::error(Code::kInvalid, "config must be a JSON object");
  Config n = c;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      const auto& v = it.value();
      if (k == "enabled") n.enabled = v.get<bool>();
      else if (k == "ops") {
        std::string text;
        if (v.is_string()) text = v.get<std::string>();
        else {
          for (const auto& e : v) text += (text.empty() ? "" : ",") + e.get<std::string>();
          if (text.empty()) text = "none";
        }
        auto ops = parse_op_list(text);
        if (!ops) return ops.status();
        n.ops = ops.value();
      } else if (k == "cache_dir") n.cache_dir = v.get<std::string>();
      else if (k == "cache_readonly") n.cache_readonly = v.get<bool>();
      else if (k == "cache_shared") n.cache_shared = v.get<bool>();
      else if (k == "evolve_memory_share") n.evolve_memory_share = std::clamp(v.get<double>(), 0.0, 1.0);
      else if (k == "evolve_sandbox") {
        auto m = parse_evolve_sandbox(v.get<std::string>());
        if (!m) return Status::error(Code::kInvalid, "evolve_sandbox must be off, cpu or all");
        n.evolve_sandbox = *m;
      }
      else if (k == "miss_log") n.miss_log = v.get<std::string>();
      else if (k == "trusted_keys") n.trusted_keys = v.get<std::string>();
      else if (k == "serve_unverified") n.serve_unverified = v.get<bool>();
      else if (k == "cxx") n.cxx = v.get<std::string>();
      else if (k == "nvrtc") n.nvrtc_path = v.get<std::string>();
      else if (k == "precision") {
        n.policy = v.get<std::string>();
        if (!valid_policy(n.policy)) return Status::error(Code::kInvalid, "precision must be fp32, tf32 or bf16");
      } else if (k == "catch_up_ms") n.catch_up_ms = v.get<int>();
      else if (k == "evolve_nice") n.evolve_nice = std::clamp(v.get<int>(), 0, 19);
      else if (k == "serve_probe_calls") n.serve_probe_calls = std::clamp(v.get<int>(), 0, 1000);
      else if (k == "shadow_calls") n.shadow_calls = std::clamp(v.get<int>(), 0, 1000000);
      else if (k == "shadow_every") n.shadow_every = std::clamp(v.get<int>(), 0, 1000000000);
      else if (k == "deterministic_only") n.deterministic_only = v.get<bool>();
      else if (k == "log_level") {
        n.log_level = v.get<std::string>();
        if (!valid_level(n.log_level)) return Status::error(Code::kInvalid, "bad log_level '" + n.log_level + "'");
      } else if (k == "evolve") n.evolve = v.get<bool>();
      else if (k == "worker") n.worker = v.get<std::string>();
      else if (k == "evolve_gpu_share") n.evolve_gpu_share = std::clamp(v.get<double>(), 0.01, 1.0);
      else if (k == "evolve_jobs") n.evolve_jobs = std::max(1, v.get<int>());
      else if (k == "evolve_key_budget_s") n.evolve_key_budget_s = v.get<double>();
      else if (k == "evolve_mu") n.evolve_mu = std::max(1, v.get<int>());
      else if (k == "evolve_lambda") n.evolve_lambda = std::max(1, v.get<int>());
      else if (k == "evolve_generations") n.evolve_generations = std::max(1, v.get<int>());
      else if (k == "evolve_capture_mb") n.evolve_capture_mb = std::max(0, v.get<int>());
      else if (k == "worker_idle_s") n.worker_idle_s = v.get<double>();
      else if (k == "llm_api") {
        n.llm_api = v.get<std::string>();
        if (!valid_llm_api(n.llm_api))
          return Status::error(Code::kInvalid, "llm_api must be openai or anthropic");
      } else if (k == "llm_url") n.llm_url = v.get<std::string>();
      else if (k == "llm_model") n.llm_model = v.get<std::string>();
      else if (k == "llm_key_env") n.llm_key_env = v.get<std::string>();
      else if (k == "evolve_candidate_timeout_s") n.evolve_candidate_timeout_s = std::max(1.0, v.get<double>());
      else return Status::error(Code::kInvalid, "unknown config key '" + k + "'");
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kInvalid, std::string("config: wrong type: ") + e.what());
  }
  c = std::move(n);
  return Status::ok();
}

nlohmann::json to_json(const Config& c) {
  return {{"enabled", c.enabled}, {"ops", c.ops}, {"cache_dir", c.cache_dir},
          {"cache_readonly", c.cache_readonly}, {"cache_shared", c.cache_shared},
          {"evolve_memory_share", c.evolve_memory_share}, {"miss_log", c.miss_log}, {"trusted_keys", c.trusted_keys}, {"evolve_sandbox", to_string(c.evolve_sandbox)}, {"serve_unverified", c.serve_unverified}, {"cxx", c.cxx},
          {"nvrtc", c.nvrtc_path}, {"precision", c.policy}, {"catch_up_ms", c.catch_up_ms}, {"serve_probe_calls", c.serve_probe_calls}, {"evolve_nice", c.evolve_nice},
          {"shadow_calls", c.shadow_calls}, {"shadow_every", c.shadow_every}, {"deterministic_only", c.deterministic_only},
          {"log_level", c.log_level}, {"evolve", c.evolve}, {"worker", c.worker},
          {"evolve_gpu_share", c.evolve_gpu_share}, {"evolve_jobs", c.evolve_jobs},
          {"evolve_key_budget_s", c.evolve_key_budget_s}, {"evolve_mu", c.evolve_mu},
          {"evolve_lambda", c.evolve_lambda}, {"evolve_generations", c.evolve_generations},
          {"evolve_capture_mb", c.evolve_capture_mb}, {"worker_idle_s", c.worker_idle_s},
          {"evolve_candidate_timeout_s", c.evolve_candidate_timeout_s}, {"llm_api", c.llm_api}, {"llm_url", c.llm_url},
          {"llm_model", c.llm_model}, {"llm_key_env", c.llm_key_env}};
}

Config load_config() {
  Config c;
  c.ops = default_ops();
  if (const char* path = std::getenv("KERNELCRAFT_CONFIG")) {
    std::ifstream f(path);
    if (!f) {
      log_once(LogLevel::kWarn, "config-open", std::string("cannot read KERNELCRAFT_CONFIG file ") + path + "; ignoring it");
    } else {
      nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      Status s = j.is_discarded() ? Status::error(Code::kInvalid, "not valid JSON") : apply_json(c, j);
      if (!s) log_once(LogLevel::kWarn, "config-parse", std::string("KERNELCRAFT_CONFIG ") + path + ": " + s.to_string() + "; ignoring it");
    }
  }
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
  };
  auto truthy = [](const char* v) { return std::string(v) == "1" || std::string(v) == "true" || std::string(v) == "yes"; };
  if (const char* v = env("KERNELCRAFT_DISABLE")) c.enabled = !truthy(v);
  if (const char* v = env("KERNELCRAFT_OPS")) {
    auto ops = parse_op_list(v);
    if (ops) c.ops = ops.value();
    else log_once(LogLevel::kWarn, "config-ops", "KERNELCRAFT_OPS: " + ops.status().message() + "; using the default list");
  }
  if (const char* v = env("KERNELCRAFT_CACHE_DIR")) c.cache_dir = v;
  if (const char* v = env("KERNELCRAFT_CACHE_READONLY")) c.cache_readonly = truthy(v);
  if (const char* v = env("KERNELCRAFT_CACHE_SHARED")) c.cache_shared = truthy(v);
  if (const char* v = env("KERNELCRAFT_MISS_LOG")) c.miss_log = v;
  if (const char* v = env("KERNELCRAFT_TRUSTED_KEYS")) c.trusted_keys = v;
  if (const char* v = env("KERNELCRAFT_EVOLVE_SANDBOX")) {
    if (auto m = parse_evolve_sandbox(v)) c.evolve_sandbox = *m;
    else log_once(LogLevel::kWarn, "config-sandbox", std::string("KERNELCRAFT_EVOLVE_SANDBOX=") + v + " is not off|cpu|all; using " + to_string(c.evolve_sandbox));
  }
  if (const char* v = env("KERNELCRAFT_SERVE_UNVERIFIED")) c.serve_unverified = truthy(v);
  if (const char* v = env("KERNELCRAFT_DETERMINISTIC_ONLY")) c.deterministic_only = truthy(v);
  if (const char* v = env("KERNELCRAFT_LLM_API")) {
    if (valid_llm_api(v)) c.llm_api = v;
    else log_once(LogLevel::kWarn, "config-llm-api", std::string("KERNELCRAFT_LLM_API=") + v + " is not openai|anthropic; using " + c.llm_api);
  }
  if (const char* v = env("KERNELCRAFT_LLM_URL")) c.llm_url = v;
  if (const char* v = env("KERNELCRAFT_LLM_MODEL")) c.llm_model = v;
  if (const char* v = env("KERNELCRAFT_LLM_KEY_ENV")) c.llm_key_env = v;
  if (const char* v = env("KERNELCRAFT_CXX")) c.cxx = v;
  if (const char* v = env("KERNELCRAFT_NVRTC")) c.nvrtc_path = v;
  if (const char* v = env("KERNELCRAFT_PRECISION")) {
    if (valid_policy(v)) c.policy = v;
    else log_once(LogLevel::kWarn, "config-prec", std::string("KERNELCRAFT_PRECISION=") + v + " is not fp32|tf32|bf16; using " + c.policy);
  }
  if (const char* v = env("KERNELCRAFT_CATCH_UP_MS")) c.catch_up_ms = std::atoi(v);
  if (const char* v = env("KERNELCRAFT_LOG_LEVEL")) {
    if (valid_level(v)) c.log_level = v;
  }
  // The evolution settings go through apply_json so their ranges are checked in one place.
  const std::pair<const char*, const char*> numeric[] = {
      {"KERNELCRAFT_EVOLVE_GPU_SHARE", "evolve_gpu_share"}, {"KERNELCRAFT_EVOLVE_JOBS", "evolve_jobs"},
      {"KERNELCRAFT_EVOLVE_KEY_BUDGET_S", "evolve_key_budget_s"}, {"KERNELCRAFT_EVOLVE_MU", "evolve_mu"},
      {"KERNELCRAFT_EVOLVE_LAMBDA", "evolve_lambda"}, {"KERNELCRAFT_EVOLVE_GENERATIONS", "evolve_generations"},
      {"KERNELCRAFT_EVOLVE_CAPTURE_MB", "evolve_capture_mb"}, {"KERNELCRAFT_WORKER_IDLE_S", "worker_idle_s"},
      {"KERNELCRAFT_EVOLVE_CANDIDATE_TIMEOUT_S", "evolve_candidate_timeout_s"},
      {"KERNELCRAFT_SERVE_PROBE_CALLS", "serve_probe_calls"}, {"KERNELCRAFT_SHADOW_CALLS", "shadow_calls"},
      {"KERNELCRAFT_SHADOW_EVERY", "shadow_every"}, {"KERNELCRAFT_EVOLVE_NICE", "evolve_nice"}, {"KERNELCRAFT_EVOLVE_MEMORY_SHARE", "evolve_memory_share"}};
  for (const auto& [var, key] : numeric) {
    const char* v = env(var);
    if (!v) continue;
    char* end = nullptr;
    double x = std::strtod(v, &end);
    nlohmann::json j = {{key, x}};
    if (std::string(key) != "evolve_gpu_share" && std::string(key) != "evolve_key_budget_s" &&
        std::string(key) != "worker_idle_s" && std::string(key) != "evolve_candidate_timeout_s" &&
        std::string(key) != "evolve_memory_share")
      j[key] = static_cast<int>(x);
    if (end == v || *end != 0 || !apply_json(c, j))
      log_once(LogLevel::kWarn, std::string("config-") + key, std::string(var) + "=" + v + " is not a valid number; ignoring it");
  }
  if (const char* v = env("KERNELCRAFT_EVOLVE")) c.evolve = truthy(v);
  if (const char* v = env("KERNELCRAFT_WORKER")) c.worker = v;
  return c;
}

}  // namespace kc
