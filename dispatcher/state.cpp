// The process's serving state: built from the configuration on first use, changed by torch_ops.
#include "dispatcher/state.h"

#include <fstream>

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

State::State() : cfg_(load_config()) {
  if (cfg_.cache_dir.empty()) cfg_.cache_dir = default_cache_dir();
  set_log_level(level_of(cfg_.log_level));
  policy_.store(policy_literal(cfg_.policy));
  apply_switches();
}

void State::apply_switches() {
  for (const auto& o : all_ops()) {
    bool want = cfg_.enabled && std::find(cfg_.ops.begin(), cfg_.ops.end(), o.name) != cfg_.ops.end();
    set_on(o.id, want);
  }
}

void State::reset_counters() {
  for (auto& c : counters_) {
    c.hits = 0;
    c.misses = 0;
    c.fallbacks = 0;
  }
}

KernelTable& State::table() {
  // Fast path without the lock: the table is created once and replaced only by configure(), which
  // keeps the old one alive (leaked) so a concurrent caller never sees a dangling pointer.
  static std::atomic<KernelTable*> cur{nullptr};
  KernelTable* t = cur.load(std::memory_order_acquire);
  if (t && t == table_.get() && table_fork_ == fork_generation()) return *t;
  std::lock_guard<std::mutex> g(mu_);
  if (table_ && table_fork_ != fork_generation()) {
    // A fork()ed child: the table's store thread and RocksDB instance are the parent's (neither has
    // threads here). Leave them untouched and start over with a table of this process's own.
    (void)table_.release();
  }
  if (!table_) {
    table_ = std::make_unique<KernelTable>(cfg_.cache_dir, cfg_.cache_readonly, cfg_.catch_up_ms);
    table_fork_ = fork_generation();
  }
  cur.store(table_.get(), std::memory_order_release);
  return *table_;
}

const std::string& State::target(Dev dev, int device) {
  if (dev == Dev::kCpu) {
    std::call_once(cpu_once_, [this] { cpu_target_ = cpu_backend().target_id(); });
    return cpu_target_;
  }
  if (device < 0 || device >= kMaxDevices) {
    static const std::string unsupported = "cuda-unsupported-device";   // never matches a record
    return unsupported;
  }
  std::call_once(cuda_once_[device], [this, device] {
    auto be = cuda_backend(device);
    if (be) {
      cuda_targets_[device] = be.value()->target_id();
    } else {
      // Keys stay well-formed (and never match a stored kernel) when the backend is unusable.
      cuda_targets_[device] = "cuda-unavailable";
      log_once(LogLevel::kWarn, "cuda-backend", "CUDA backend unavailable (" + be.status().to_string() +
                                                    "); CUDA ops run eager");
    }
  });
  return cuda_targets_[device];
}

void State::record_miss(const std::string& key) {
  std::string path;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (missed_set_.size() >= kMaxMissedKeys || !missed_set_.insert(key).second) return;
    missed_.push_back(key);
    path = cfg_.miss_log;
  }
  if (!path.empty()) {
    std::ofstream f(path, std::ios::app);
    if (f) f << key << "\n";
    else log_once(LogLevel::kWarn, "miss-log", "cannot append to miss log " + path);
  }
}

std::vector<std::string> State::missed_keys() const {
  std::lock_guard<std::mutex> g(mu_);
  return missed_;
}

Config State::config() const {
  std::lock_guard<std::mutex> g(mu_);
  return cfg_;
}

Status State::configure(const nlohmann::json& j) {
  std::vector<std::string> ops;
  {
    std::lock_guard<std::mutex> g(mu_);
    Config next = cfg_;
    KC_RETURN_IF_ERROR(apply_json(next, j));
    if (next.cache_dir.empty()) next.cache_dir = default_cache_dir();
    bool reopen = next.cache_dir != cfg_.cache_dir || next.cache_readonly != cfg_.cache_readonly ||
                  next.catch_up_ms != cfg_.catch_up_ms;
    cfg_ = next;
    set_log_level(level_of(cfg_.log_level));
    set_cache_dir_shared(cfg_.cache_shared);
    policy_.store(policy_literal(cfg_.policy));
    apply_switches();
    if (reopen && table_) {
      // Old table stays allocated: calls in flight may still hold a reference to it. Its store
      // thread stops; those calls see what it had loaded. (A table inherited through fork() has
      // no thread here to stop.)
      if (table_fork_ == fork_generation()) table_->retire();
      (void)table_.release();
    }
    ops = cfg_.ops;
  }
  register_ops(ops);
  return Status::ok();
}

nlohmann::json State::status_json() {
  nlohmann::json ops = nlohmann::json::object();
  uint64_t th = 0, tm = 0, tf = 0;
  for (const auto& o : all_ops()) {
    OpCounters& c = counters(o.id);
    uint64_t h = c.hits, m = c.misses, f = c.fallbacks;
    th += h; tm += m; tf += f;
    if (!registered(o.id) && !h && !m && !f) continue;
    ops[o.name] = {{"aten", o.aten}, {"intercepted", registered(o.id) && on(o.id)},
                   {"hits", h}, {"misses", m}, {"fallbacks", f}};
  }
  Config c = config();
  KernelTable& t = table();
  return {{"enabled", c.enabled},
          {"ops", ops},
          {"total", {{"hits", th}, {"misses", tm}, {"fallbacks", tf}, {"calls", th + tm + tf}}},
          {"cache", {{"dir", t.dir()}, {"state", t.store_state()}, {"readonly", c.cache_readonly},
                     {"loaded_kernels", t.loaded_count()}}},
          {"precision", policy()},
          {"missed_keys", missed_keys().size()}};
}

}  // namespace kc::dispatch
