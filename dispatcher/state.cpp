// The process's serving state: built from the configuration on first use, changed by torch_ops.
#include "dispatcher/state.h"

#include <algorithm>
#include <fstream>

#include <ATen/Context.h>

#include "dispatcher/shadow.h"
#include "runtime/cache_dir.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/fork.h"
#include "runtime/log.h"

namespace kc::dispatch {
namespace {

constexpr size_t kMaxMissedKeys = 4096;   // bounded: a model with dynamic shapes must not grow us

const char* policy_literal(const std::string& p) {
  if (p == "tf32") return "tf32";
  if (p == "bf16") return "bf16";
  return "fp32";
}

LogLevel level_of(const std::string& s) {
  if (s == "debug") return LogLevel::kDebug;
  if (s == "info") return LogLevel::kInfo;
  if (s == "error") return LogLevel::kError;
  if (s == "off") return LogLevel::kOff;
  return LogLevel::kWarn;
}

}  // namespace

State& State::get() {
  // Leaked on purpose: interception may run during interpreter shutdown, after static destructors.
  static State* s = new State();
  return *s;
}

State::State() {
  auto* c = new Config(load_config());
  if (c->cache_dir.empty()) c->cache_dir = default_cache_dir();
  set_log_level(level_of(c->log_level));
  policy_.store(policy_literal(c->policy));
  apply_switches(*c);
  cfg_.store(c, std::memory_order_release);
}

void State::apply_switches(const Config& c) {
  for (const auto& o : all_ops()) {
    bool want = c.enabled && std::find(c.ops.begin(), c.ops.end(), o.name) != c.ops.end();
    set_on(o.id, want);
  }
  shadow_calls_.store(c.cache_readonly ? 0 : c.shadow_calls, std::memory_order_relaxed);
  shadow_every_.store(c.cache_readonly ? 0 : c.shadow_every, std::memory_order_relaxed);
  shadow_calls_elsewhere_.store(c.cache_readonly ? 0 : std::max(c.shadow_calls, kChecksNotVerifiedHere),
                                std::memory_order_relaxed);
  deterministic_only_.store(c.deterministic_only, std::memory_order_relaxed);
}

bool State::determinism_required() const {
  return deterministic_only_.load(std::memory_order_relaxed) || at::globalContext().deterministicAlgorithms();
}

void State::reset_counters() {
  for (auto& c : counters_) {
    c.hits = 0;
    c.misses = 0;
    c.fallbacks = 0;
    c.probes = 0;
    c.demoted = 0;
    c.shadow_checks = 0;
    c.shadow_mismatches = 0;
    c.shadow_us = 0;
    c.nondeterministic = 0;
  }
}

KernelTable& State::table() {
  // Fast path without the lock. The table is created once per process and replaced only by
  // configure(), which keeps the old one alive (leaked) so a concurrent caller never sees a
  // dangling pointer. A fork()ed child gets a PerProcess without one: the parent's table, its
  // store thread and RocksDB instance are left untouched, and the child makes its own.
  PerProcess& p = proc_.get();
  if (KernelTable* t = p.table.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> g(p.mu);
  KernelTable* t = p.table.load(std::memory_order_acquire);
  if (!t) {
    const Config c = config();
    t = new KernelTable(c.cache_dir, c.cache_readonly, c.catch_up_ms);
    p.table.store(t, std::memory_order_release);
  }
  return *t;
}

void State::shut_down() {
  if (KernelTable* t = proc_.get().table.load(std::memory_order_acquire)) t->retire();
}

const std::string& State::target(Dev dev, int device) {
  if (dev == Dev::kCuda && (device < 0 || device >= kMaxDevices)) {
    static const std::string unsupported = "cuda-unsupported-device";   // never matches a record
    return unsupported;
  }
  std::atomic<const std::string*>& slot = targets_[dev == Dev::kCpu ? 0 : 1 + device];
  if (const std::string* t = slot.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> g(proc_.get().target_mu);
  if (const std::string* t = slot.load(std::memory_order_acquire)) return *t;
  std::string id;
  if (auto be = backend_for(dev, device)) {
    id = be.value()->target_id();
  } else {
    // Keys stay well-formed (and never match a stored kernel) when the backend is unusable.
    id = "cuda-unavailable";
    log_once(LogLevel::kWarn, "cuda-backend", "CUDA backend unavailable (" + be.status().to_string() +
                                                  "); CUDA ops run eager");
  }
  const std::string* t = new std::string(std::move(id));   // leaked: returned references stay valid
  slot.store(t, std::memory_order_release);
  return *t;
}

void State::record_miss(const std::string& key) {
  std::string path;
  {
    PerProcess& p = proc_.get();
    std::lock_guard<std::mutex> g(p.mu);
    if (p.missed_set.size() >= kMaxMissedKeys || !p.missed_set.insert(key).second) return;
    p.missed.push_back(key);
    path = config().miss_log;
  }
  if (!path.empty()) {
    std::ofstream f(path, std::ios::app);
    if (f) f << key << "\n";
    else log_once(LogLevel::kWarn, "miss-log", "cannot append to miss log " + path);
  }
}

std::vector<std::string> State::missed_keys() const {
  PerProcess& p = proc_.get();
  std::lock_guard<std::mutex> g(p.mu);
  return p.missed;
}

Config State::config() const { return *cfg_.load(std::memory_order_acquire); }

Status State::configure(const nlohmann::json& j) {
  std::vector<std::string> ops;
  {
    PerProcess& p = proc_.get();
    std::lock_guard<std::mutex> g(p.mu);   // one configure() at a time
    const Config& cur = *cfg_.load(std::memory_order_acquire);
    auto next = std::make_unique<Config>(cur);
    KC_RETURN_IF_ERROR(apply_json(*next, j));
    if (next->cache_dir.empty()) next->cache_dir = default_cache_dir();
    bool reopen = next->cache_dir != cur.cache_dir || next->cache_readonly != cur.cache_readonly ||
                  next->catch_up_ms != cur.catch_up_ms;
    set_log_level(level_of(next->log_level));
    set_cache_dir_shared(next->cache_shared);
    policy_.store(policy_literal(next->policy));
    apply_switches(*next);
    ops = next->ops;
    cfg_.store(next.release(), std::memory_order_release);   // the previous one is leaked: see cfg_
    if (KernelTable* t = p.table.load(std::memory_order_acquire); reopen && t) {
      // The old table stays allocated: calls in flight may still hold a reference to it. Its store
      // thread stops; those calls see what it had loaded.
      t->retire();
      p.table.store(nullptr, std::memory_order_release);
    }
  }
  register_ops(ops);
  return Status::ok();
}

nlohmann::json State::status_json() {
  nlohmann::json ops = nlohmann::json::object();
  uint64_t th = 0, tm = 0, tf = 0, tp = 0, td = 0, tsc = 0, tsm = 0, tnd = 0, tus = 0;
  for (const auto& o : all_ops()) {
    OpCounters& c = counters(o.id);
    uint64_t h = c.hits, m = c.misses, f = c.fallbacks, p = c.probes, d = c.demoted;
    uint64_t sc = c.shadow_checks, sm = c.shadow_mismatches, nd = c.nondeterministic;
    th += h; tm += m; tf += f; tp += p; td += d; tsc += sc; tsm += sm; tnd += nd;
    tus += c.shadow_us.load(std::memory_order_relaxed);
    if (!registered(o.id) && !h && !m && !f && !p) continue;
    ops[o.name] = {{"aten", o.aten}, {"intercepted", registered(o.id) && on(o.id)},
                   {"hits", h}, {"misses", m}, {"fallbacks", f}, {"probes", p}, {"demoted", d},
                   {"shadow_checks", sc}, {"shadow_mismatches", sm}, {"nondeterministic", nd}};
  }
  Config c = config();
  KernelTable& t = table();
  return {{"enabled", c.enabled},
          {"ops", ops},
          {"total", {{"hits", th}, {"misses", tm}, {"fallbacks", tf}, {"probes", tp}, {"demoted", td},
                     {"shadow_checks", tsc}, {"shadow_mismatches", tsm}, {"nondeterministic", tnd},
                     {"calls", th + tm + tf + tp}}},
          {"shadow", {{"calls", shadow_calls()}, {"every", shadow_every()}, {"disabled", tsm},
                      {"check_ms", static_cast<double>(tus) / 1e3}, {"fused_outputs", fused_comparisons()},
                      {"cache_writes", disable_status()}}},
          {"determinism_required", determinism_required()},
          {"cache", {{"dir", t.dir()}, {"state", t.store_state()}, {"readonly", c.cache_readonly},
                     {"loaded_kernels", t.loaded_count()}}},
          {"precision", policy()},
          {"missed_keys", missed_keys().size()}};
}

}  // namespace kc::dispatch
