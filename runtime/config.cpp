// Configuration: defaults, the KERNELCRAFT_CONFIG JSON file, then KERNELCRAFT_* environment variables.
// Every setting is one row of settings() below: its JSON key, its environment variable, how its
// value is read and checked, and the text of README.md's table (a test keeps the two equal).
#include "runtime/config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <variant>

#include "runtime/log.h"
#include "runtime/ops.h"

namespace kc {

namespace {

constexpr double kNone = std::numeric_limits<double>::infinity();

// How one setting is read. Numbers are clamped into [lo, hi]; strings with choices must be one of
// them; the op list and the sandbox mode have parsers of their own.
struct BoolField { bool Config::*m; bool env_negates; };
struct IntField { int Config::*m; double lo, hi; };
struct RealField { double Config::*m; double lo, hi; };
struct StrField { std::string Config::*m; std::vector<std::string> choices; };
struct OpsField {};
struct SandboxField {};
using Field = std::variant<BoolField, IntField, RealField, StrField, OpsField, SandboxField>;

Field Bool(bool Config::*m, bool env_negates = false) { return BoolField{m, env_negates}; }
Field Int(int Config::*m, double lo = -kNone, double hi = kNone) { return IntField{m, lo, hi}; }
Field Real(double Config::*m, double lo = -kNone, double hi = kNone) { return RealField{m, lo, hi}; }
Field Str(std::string Config::*m, std::vector<std::string> choices = {}) { return StrField{m, std::move(choices)}; }
Field Ops() { return OpsField{}; }
Field Sandbox() { return SandboxField{}; }

struct Setting {
  const char* name;   // JSON key
  const char* env;    // environment variable
  Field field;
  const char* help;   // README.md's "meaning" column
};

const std::vector<Setting>& settings() {
  static const std::vector<Setting> s = {
      {"enabled", "KERNELCRAFT_DISABLE", Bool(&Config::enabled, true),
       "global switch: `KERNELCRAFT_DISABLE=1` turns interception off"},
      {"ops", "KERNELCRAFT_OPS", Ops(),
       "`default`, `all`, `none`, `relu,softmax`, or `-gelu` (relative to default)"},
      {"cache_dir", "KERNELCRAFT_CACHE_DIR", Str(&Config::cache_dir),
       "cache directory; default `$XDG_CACHE_HOME/kernelcraft` or `~/.cache/kernelcraft`"},
      {"cache_readonly", "KERNELCRAFT_CACHE_READONLY", Bool(&Config::cache_readonly),
       "serve a shipped cache (RocksDB read-only open, works on read-only media)"},
      {"cache_shared", "KERNELCRAFT_CACHE_SHARED", Bool(&Config::cache_shared),
       "allow a shared cache directory: one owned by another user or writable by group/others (off: "
       "such a directory is refused with one log line and the process runs eager; a directory "
       "kernelcraft creates is 0700). Files in it are written with `O_NOFOLLOW`/`O_EXCL` either way"},
      {"miss_log", "KERNELCRAFT_MISS_LOG", Str(&Config::miss_log),
       "append every newly missed key to this file (for pre-warming)"},
      {"trusted_keys", "KERNELCRAFT_TRUSTED_KEYS", Str(&Config::trusted_keys),
       "comma-separated bundle-signing public keys (`.pub` files or directories of them); when set, "
       "`cache import` accepts only bundles signed by one of them (`--trust` overrides it)"},
      {"serve_unverified", "KERNELCRAFT_SERVE_UNVERIFIED", Bool(&Config::serve_unverified),
       "also serve records stored without the gauntlet (`put_kernel`, `cache put` without "
       "`--verify`); off by default"},
      {"cxx", "KERNELCRAFT_CXX", Str(&Config::cxx),
       "host compiler for CPU kernels (default `c++`)"},
      {"nvrtc", "KERNELCRAFT_NVRTC", Str(&Config::nvrtc_path),
       "libnvrtc to try first"},
      {"precision", "KERNELCRAFT_PRECISION", Str(&Config::policy, {"fp32", "tf32", "bf16"}),
       "`fp32` (default), `tf32`, `bf16`; part of every key"},
      {"catch_up_ms", "KERNELCRAFT_CATCH_UP_MS", Int(&Config::catch_up_ms),
       "how often a serving process looks for kernels written by others (500)"},
      {"serve_probe_calls", "KERNELCRAFT_SERVE_PROBE_CALLS", Int(&Config::serve_probe_calls, 0, 1000),
       "calls of a newly served key that also run eager, both timed in this process; a kernel not "
       "faster here is demoted to eager (8; 0 turns the probe off)"},
      {"shadow_calls", "KERNELCRAFT_SHADOW_CALLS", Int(&Config::shadow_calls, 0, 1000000),
       "the live check: the first served calls of a key in this process also run eager on the same "
       "inputs and are compared (4; 0: none). Off with `cache_readonly`"},
      {"shadow_every", "KERNELCRAFT_SHADOW_EVERY", Int(&Config::shadow_every, 0, 1000000000),
       "after those, 1 served call in this many, on average, is checked the same way (1000; 0: "
       "never; 1: every call)"},
      {"deterministic_only", "KERNELCRAFT_DETERMINISTIC_ONLY", Bool(&Config::deterministic_only),
       "serve only kernels the gauntlet saw bitwise deterministic, the rest run eager; "
       "`torch.use_deterministic_algorithms(True)` does the same while it is on (off)"},
      {"log_level", "KERNELCRAFT_LOG_LEVEL", Str(&Config::log_level, {"debug", "info", "warn", "error", "off"}),
       "`debug info warn error off` (default warn)"},
      {"evolve", "KERNELCRAFT_EVOLVE", Bool(&Config::evolve),
       "start background evolution for missed keys (default on; `0` turns it off)"},
      {"worker", "KERNELCRAFT_WORKER", Str(&Config::worker),
       "the `kernelcraft` executable the worker runs as (default: next to the library)"},
      {"evolve_gpu_share", "KERNELCRAFT_EVOLVE_GPU_SHARE", Real(&Config::evolve_gpu_share, 0.01, 1.0),
       "fraction of wall time the worker keeps the GPU busy (0.2)"},
      {"evolve_jobs", "KERNELCRAFT_EVOLVE_JOBS", Int(&Config::evolve_jobs, 1),
       "keys searched concurrently (1; they share the GPU share)"},
      {"evolve_key_budget_s", "KERNELCRAFT_EVOLVE_KEY_BUDGET_S", Real(&Config::evolve_key_budget_s),
       "wall-clock seconds per key's search (600)"},
      {"evolve_mu", "KERNELCRAFT_EVOLVE_MU", Int(&Config::evolve_mu, 1),
       "parents kept per generation of the search (4)"},
      {"evolve_lambda", "KERNELCRAFT_EVOLVE_LAMBDA", Int(&Config::evolve_lambda, 1),
       "children per generation (8)"},
      {"evolve_generations", "KERNELCRAFT_EVOLVE_GENERATIONS", Int(&Config::evolve_generations, 1),
       "generation limit per key (8)"},
      {"evolve_capture_mb", "KERNELCRAFT_EVOLVE_CAPTURE_MB", Int(&Config::evolve_capture_mb, 0),
       "largest inputs captured for a job (64 MiB; larger keys use generated inputs only)"},
      {"evolve_candidate_timeout_s", "KERNELCRAFT_EVOLVE_CANDIDATE_TIMEOUT_S",
       Real(&Config::evolve_candidate_timeout_s, 1.0),
       "a candidate running longer is killed as hung (180)"},
      {"evolve_memory_share", "KERNELCRAFT_EVOLVE_MEMORY_SHARE", Real(&Config::evolve_memory_share, 0.0, 1.0),
       "the CPU evaluation child runs under `RLIMIT_AS` = this fraction of `MemAvailable` at its "
       "start (0.5; 0: no cap); a key whose inputs and references would not fit is skipped with the "
       "reason in the worker log. CUDA children get no `RLIMIT_AS` (the driver reserves huge virtual "
       "ranges)"},
      {"evolve_sandbox", "KERNELCRAFT_EVOLVE_SANDBOX", Sandbox(),
       "how candidates are confined (see \"The evaluation sandbox\"): `cpu` (default: syscall filter "
       "for CPU candidates, resource limits for all), `all` (the filter's CUDA variant for CUDA "
       "candidates too; check it on your GPU first), `off` (nothing: for strace, gdb, core files)"},
      {"evolve_nice", "KERNELCRAFT_EVOLVE_NICE", Int(&Config::evolve_nice, 0, 19),
       "the worker's CPU priority, nice 0..19 (10: below the user's job)"},
      {"worker_idle_s", "KERNELCRAFT_WORKER_IDLE_S", Real(&Config::worker_idle_s),
       "an idle worker exits after this (60); the next miss starts one"},
      {"job_store", "KERNELCRAFT_JOB_STORE", Str(&Config::job_store),
       "job-wide coordination of a distributed job (see \"Distributed jobs\"): empty (default) uses "
       "the job's c10d store at `MASTER_ADDR:MASTER_PORT` when `WORLD_SIZE` > 1; `off`; or `host:port`"},
      {"job_lease_s", "KERNELCRAFT_JOB_LEASE_S", Real(&Config::job_lease_s, 1.0),
       "a node's claim on a key it searches, renewed while it searches; unrenewed this long, another "
       "node takes the key over (60)"},
      {"job_poll_ms", "KERNELCRAFT_JOB_POLL_MS", Int(&Config::job_poll_ms, 50, 60000),
       "how often claims are renewed and other nodes' published records read (1000)"},
      {"job_store_timeout_ms", "KERNELCRAFT_JOB_STORE_TIMEOUT_MS", Int(&Config::job_store_timeout_ms, 100, 600000),
       "the longest a job-store call may take; after a failure or a timeout the process stops using "
       "the store, with one log line, and searches locally (3000)"},
      {"llm_api", "KERNELCRAFT_LLM_API", Str(&Config::llm_api, {"openai", "anthropic"}),
       "`openai` (chat completions, `Authorization: Bearer`) or `anthropic` (messages, `x-api-key`)"},
      {"llm_url", "KERNELCRAFT_LLM_URL", Str(&Config::llm_url),
       "the endpoint for the LLM proposer (off when empty)"},
      {"llm_model", "KERNELCRAFT_LLM_MODEL", Str(&Config::llm_model),
       "model name sent with each request"},
      {"llm_key_env", "KERNELCRAFT_LLM_KEY_ENV", Str(&Config::llm_key_env),
       "the environment variable holding the API key (default `KERNELCRAFT_LLM_KEY`)"},
  };
  return s;
}

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

template <class... F>
struct Visit : F... { using F::operator()...; };
template <class... F>
Visit(F...) -> Visit<F...>;

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
  return out;
}

// Sets one setting of `n` from its JSON value; kInvalid with the reason. Throws nlohmann's type
// errors, which apply_json turns into kInvalid.
Status set_field(Config& n, const Setting& st, const nlohmann::json& v) {
  return std::visit(
      Visit{[&](const BoolField& f) { n.*f.m = v.get<bool>(); return Status::ok(); },
            [&](const IntField& f) {
              n.*f.m = static_cast<int>(std::clamp(static_cast<double>(v.get<int>()), f.lo, f.hi));
              return Status::ok();
            },
            [&](const RealField& f) { n.*f.m = std::clamp(v.get<double>(), f.lo, f.hi); return Status::ok(); },
            [&](const StrField& f) {
              std::string x = v.get<std::string>();
              if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), x) == f.choices.end())
                return Status::error(Code::kInvalid, std::string(st.name) + " must be one of " + joined(f.choices) +
                                                         " (got '" + x + "')");
              n.*f.m = std::move(x);
              return Status::ok();
            },
            [&](const OpsField&) {
              std::string text;
              if (v.is_string()) {
                text = v.get<std::string>();
              } else {
                for (const auto& e : v) text += (text.empty() ? "" : ",") + e.get<std::string>();
                if (text.empty()) text = "none";
              }
              auto ops = parse_op_list(text);
              if (!ops) return ops.status();
              n.ops = ops.value();
              return Status::ok();
            },
            [&](const SandboxField&) {
              auto m = parse_evolve_sandbox(v.get<std::string>());
              if (!m) return Status::error(Code::kInvalid, "evolve_sandbox must be off, cpu or all");
              n.evolve_sandbox = *m;
              return Status::ok();
            }},
      st.field);
}

nlohmann::json get_field(const Config& c, const Setting& st) {
  return std::visit(Visit{[&](const BoolField& f) { return nlohmann::json(c.*f.m); },
                          [&](const IntField& f) { return nlohmann::json(c.*f.m); },
                          [&](const RealField& f) { return nlohmann::json(c.*f.m); },
                          [&](const StrField& f) { return nlohmann::json(c.*f.m); },
                          [&](const OpsField&) { return nlohmann::json(c.ops); },
                          [&](const SandboxField&) { return nlohmann::json(to_string(c.evolve_sandbox)); }},
                    st.field);
}

// An environment variable's text as the JSON value its setting takes; nullopt if it is not one
// (a number that does not parse).
std::optional<nlohmann::json> env_value(const Setting& st, const char* v) {
  auto number = [&]() -> std::optional<double> {
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    if (end == v || *end != 0 || !std::isfinite(x)) return std::nullopt;
    return x;
  };
  return std::visit(
      Visit{[&](const BoolField& f) -> std::optional<nlohmann::json> {
              const std::string s = v;
              const bool on = s == "1" || s == "true" || s == "yes";
              return nlohmann::json(f.env_negates ? !on : on);
            },
            [&](const IntField&) -> std::optional<nlohmann::json> {
              auto x = number();
              if (!x) return std::nullopt;
              return nlohmann::json(static_cast<int>(std::clamp(*x, -2e9, 2e9)));
            },
            [&](const RealField&) -> std::optional<nlohmann::json> {
              auto x = number();
              if (!x) return std::nullopt;
              return nlohmann::json(*x);
            },
            [&](const auto&) -> std::optional<nlohmann::json> { return nlohmann::json(std::string(v)); }},
      st.field);
}

const Setting* find_setting(const std::string& name) {
  for (const auto& s : settings())
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> f = [] {
    std::vector<ConfigField> out;
    for (const auto& s : settings()) out.push_back({s.name, s.env, s.help});
    return out;
  }();
  return f;
}

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
      const Setting* st = find_setting(it.key());
      if (!st) return Status::error(Code::kInvalid, "unknown config key '" + it.key() + "'");
      KC_RETURN_IF_ERROR(set_field(n, *st, it.value()));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kInvalid, std::string("config: wrong type: ") + e.what());
  }
  c = std::move(n);
  return Status::ok();
}

nlohmann::json to_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& s : settings()) j[s.name] = get_field(c, s);
  return j;
}

nlohmann::json evolution_settings(const Config& c) {
  return {{"search", {{"mu", c.evolve_mu}, {"lambda", c.evolve_lambda}, {"max_generations", c.evolve_generations},
                      {"key_budget_s", c.evolve_key_budget_s}}},
          {"candidate_timeout_s", c.evolve_candidate_timeout_s},
          {"gpu_share", c.evolve_gpu_share},
          {"jobs", c.evolve_jobs},
          {"memory_share", c.evolve_memory_share},
          {"llm", {{"api", c.llm_api}, {"url", c.llm_url}, {"model", c.llm_model}, {"key_env", c.llm_key_env}}}};
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
  // Each variable through the same parser and checks as the file; a bad one keeps the value before it.
  for (const auto& st : settings()) {
    const char* v = std::getenv(st.env);
    if (!v || !*v) continue;
    auto value = env_value(st, v);
    Status s = value ? apply_json(c, nlohmann::json{{st.name, *value}})
                     : Status::error(Code::kInvalid, "not a number");
    if (!s)
      log_once(LogLevel::kWarn, std::string("config-") + st.name,
               std::string(st.env) + "=" + v + ": " + s.message() + "; keeping " + get_field(c, st).dump());
  }
  return c;
}

}  // namespace kc
