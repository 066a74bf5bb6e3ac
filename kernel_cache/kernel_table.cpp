// KernelTable: memory first, the store on first sight, a rate-limited catch-up for later writes.
#include "kernel_cache/kernel_table.h"

#include "runtime/log.h"

namespace kc {

KernelTable::KernelTable(std::string dir, bool readonly, int catch_up_ms)
    : dir_(std::move(dir)), readonly_(readonly), catch_up_every_(catch_up_ms) {}

KernelTable::Lookup KernelTable::find(const std::string& key) {
  // Misses are where kernels written by other processes show up: look for them when one is due.
  auto due = [this] {
    return catch_up_every_.count() > 0 &&
           std::chrono::steady_clock::now().time_since_epoch().count() >= next_catch_up_.load(std::memory_order_relaxed);
  };
  {
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      const Entry& e = it->second;
      switch (e.kind) {
        case Kind::kServe: return {Kind::kServe, e.kernel, nullptr, false};
        case Kind::kDisabled: return {Kind::kDisabled, nullptr, nullptr, false};
        case Kind::kEagerBest: return {Kind::kEagerBest, nullptr, nullptr, false};
        default:
          // kMiss (or a kLoad someone else is doing): trust it until a catch-up may have changed it.
          if ((e.gen == gen_.load(std::memory_order_relaxed) && !due()) || catch_up_every_.count() <= 0)
            return {e.kind == Kind::kLoad ? Kind::kDisabled : Kind::kMiss, nullptr, nullptr, false};
      }
    }
  }
  maybe_catch_up();   // rate-limited inside; the first call opens the store
  return consult_store(key);
}

void KernelTable::maybe_catch_up() {
  std::unique_lock<std::mutex> g(store_mu_, std::try_to_lock);
  if (!g.owns_lock()) return;   // someone else is doing it; never make a caller wait for the store
  auto now = std::chrono::steady_clock::now();
  if (tried_ && (catch_up_every_.count() <= 0 || now - last_try_ < catch_up_every_)) return;
  tried_ = true;
  last_try_ = now;
  next_catch_up_.store((now + catch_up_every_).time_since_epoch().count(), std::memory_order_relaxed);
  if (!store_) {
    auto s = Store::open(dir_, readonly_ ? Store::Mode::kReadOnly : Store::Mode::kReader);
    if (!s) {
      if (s.status().code() == Code::kNotFound) {
        store_state_ = "missing";
      } else {
        store_state_ = "unavailable: " + s.status().to_string();
        log_once(LogLevel::kWarn, "store-open:" + dir_,
                 "cache at " + dir_ + " is unusable (" + s.status().to_string() + "); serving eager");
      }
      return;
    }
    store_ = std::move(s.value());
    store_state_ = "open";
  } else {
    store_->catch_up().ignore();   // a failed catch-up keeps the older view, which is still valid
  }
  gen_.fetch_add(1, std::memory_order_relaxed);
}

KernelTable::Lookup KernelTable::consult_store(const std::string& key) {
  Lookup out;
  Kind kind = Kind::kMiss;
  {
    std::lock_guard<std::mutex> g(store_mu_);
    if (store_) {
      auto bytes = store_->get(key);
      if (bytes) {
        auto rec = decode_record(bytes.value());
        if (!rec) {
          log_once(LogLevel::kWarn, "bad-record:" + key,
                   "cache record is unreadable (" + rec.status().to_string() + "); serving eager for it");
          kind = Kind::kDisabled;
        } else if (rec->state == "served" && !rec->blob.empty()) {
          kind = Kind::kLoad;
          out.record = std::make_shared<const Record>(std::move(rec.value()));
        } else if (rec->state == "eager_best") {
          kind = Kind::kEagerBest;
        } else {
          kind = Kind::kDisabled;
        }
      } else if (bytes.status().code() != Code::kNotFound) {
        log_once(LogLevel::kWarn, "store-get", "cache read failed (" + bytes.status().to_string() + "); serving eager");
      }
    }
  }
  std::unique_lock<std::shared_mutex> g(mu_);
  auto [it, inserted] = entries_.try_emplace(key, Entry{kind, gen_.load(), nullptr});
  if (!inserted) {
    if (it->second.kind == Kind::kServe) return {Kind::kServe, it->second.kernel, nullptr, false};
    if (it->second.kind == Kind::kLoad) return {Kind::kDisabled, nullptr, nullptr, false};  // another thread loads
    out.first_miss = false;
    it->second.kind = kind;
    it->second.gen = gen_.load();
  } else {
    out.first_miss = (kind == Kind::kMiss);
  }
  out.kind = kind;
  return out;
}

void KernelTable::install(std::shared_ptr<LoadedKernel> k) {
  std::unique_lock<std::shared_mutex> g(mu_);
  std::string key = k->key;
  entries_[key] = Entry{Kind::kServe, gen_.load(), std::move(k)};
}

void KernelTable::disable(const std::string& key, const std::string& why) {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_[key] = Entry{Kind::kDisabled, gen_.load(), nullptr};
  }
  log_once(LogLevel::kWarn, "disabled:" + key, "kernel disabled, serving eager (" + why + ") for key " + key);
}

void KernelTable::forget(const std::string& key) {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_.erase(key);
  }
  std::lock_guard<std::mutex> g(store_mu_);
  tried_ = false;   // the next lookup catches up with writers at once
  next_catch_up_.store(0);
}

void KernelTable::forget_all() {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_.clear();
  }
  std::lock_guard<std::mutex> g(store_mu_);
  tried_ = false;
  next_catch_up_.store(0);
}

std::string KernelTable::store_state() const {
  std::lock_guard<std::mutex> g(store_mu_);
  return store_state_;
}

size_t KernelTable::loaded_count() const {
  std::shared_lock<std::shared_mutex> g(mu_);
  size_t n = 0;
  for (const auto& [k, e] : entries_) n += e.kind == Kind::kServe;
  return n;
}

}  // namespace kc
