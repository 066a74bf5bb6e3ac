// KernelTable: memory first, the store on first sight, a rate-limited catch-up for later writes,
// and the store's own thread for opening and catching up.
#include "kernel_cache/kernel_table.h"

#include <condition_variable>
#include <exception>
#include <unordered_map>
#include <utility>

#include "runtime/log.h"

namespace kc {

// Opening a RocksDB database and catching up with its writers usually take a millisecond, but they
// read files other processes write: a damaged MANIFEST spun RocksDB 7.8's secondary forever
// (store.cpp screens for that one), and a slow or hung filesystem can stall any of it. The caller
// is someone's training step, so the work happens here, and callers wait for it only so long.
struct KernelTable::StoreThread {
  using Watched = std::unordered_map<std::string, std::shared_ptr<const Record>>;
  using Revoked = std::vector<std::pair<std::string, std::shared_ptr<const Record>>>;

  std::mutex mu;                       // guards everything below but the atomics; never held across RocksDB
  std::condition_variable cv;          // requests, completions, stop and the first watched kernel
  std::shared_ptr<Store> store;        // null until an open succeeds
  std::string state = "not opened";
  uint64_t requested = 0, done = 0;
  bool busy = false, stop = false, exited = false;
  std::chrono::steady_clock::time_point busy_since{};
  std::chrono::milliseconds catch_up_every{0};
  // Served kernels, rechecked after every catch-up, and on the thread's own schedule while there
  // are any: a hit never consults the store, so without this a removed or disabled record would
  // be served for as long as the process hits.
  Watched watched;
  Revoked revoked;                     // records that changed or went; the table drops them
  std::atomic<bool> has_revoked{false};
  std::atomic<uint64_t> gen{1};        // bumped after every refresh: cached misses become stale
  std::atomic<uint64_t> checked_seq{~uint64_t{0}};   // store sequence the watched records were checked at

  // The watched records whose stored record is gone, no longer served, or another one now.
  static Revoked stale(Store& store, const Watched& w) {
    Revoked out;
    for (const auto& [key, old] : w) {
      auto bytes = store.get(key);
      if (!bytes && bytes.status().code() != Code::kNotFound) continue;   // unreadable now: keep serving
      Result<Record> now = bytes ? decode_record(bytes.value()) : Result<Record>(bytes.status());
      if (!now || now->state != RecordState::kServed || now->blob != old->blob || now->launch != old->launch ||
          record_verified(now.value()) != record_verified(*old))
        out.emplace_back(key, old);
    }
    return out;
  }

  // The thread's loop. It owns nothing of the table, so a table may be destroyed while it is stuck.
  static void run(const std::shared_ptr<StoreThread>& t, const StoreOpener& open, const std::string& dir) {
    std::unique_lock<std::mutex> g(t->mu);
    auto asked = [&] { return t->stop || t->requested > t->done; };
    auto scheduled = [&] { return t->catch_up_every.count() > 0 && !t->watched.empty(); };
    for (;;) {
      bool due = false;
      if (scheduled()) due = !t->cv.wait_for(g, t->catch_up_every, asked);
      else t->cv.wait(g, [&] { return asked() || scheduled(); });
      if (t->stop) break;
      if (!due && !asked()) continue;   // the first kernel to watch: start the schedule
      uint64_t target = t->requested;
      t->busy = true;
      t->busy_since = std::chrono::steady_clock::now();
      std::shared_ptr<Store> store = t->store;
      Watched watched = t->watched;
      g.unlock();
      std::shared_ptr<Store> opened;
      std::string state;
      Revoked revoked;
      try {   // an exception escaping a thread would terminate the user's process
        if (store) {
          store->catch_up().ignore();   // a failed catch-up keeps the older view, which is still valid
          // Rechecking reads and decodes every served record: only when a write came in since.
          const uint64_t seq = store->sequence();
          if (seq != t->checked_seq.load(std::memory_order_relaxed)) {
            revoked = stale(*store, watched);
            t->checked_seq.store(seq, std::memory_order_relaxed);
          }
        } else {
          state = open_state(open, dir, opened);
        }
      } catch (const std::exception& e) {
        state = std::string("unavailable: ") + e.what();
      } catch (...) {
        state = "unavailable: unknown exception";
      }
      g.lock();
      if (opened) t->store = std::move(opened);
      if (!state.empty()) t->state = std::move(state);
      for (auto& r : revoked) {
        auto it = t->watched.find(r.first);
        if (it != t->watched.end() && it->second == r.second) t->watched.erase(it);
        t->revoked.push_back(std::move(r));
      }
      if (!t->revoked.empty()) t->has_revoked.store(true, std::memory_order_release);
      t->busy = false;
      t->done = target;
      t->gen.fetch_add(1, std::memory_order_relaxed);
      t->cv.notify_all();
    }
    t->exited = true;
    t->cv.notify_all();
  }

  // Opens the store; the state string for status(), and `opened` on success.
  static std::string open_state(const StoreOpener& open, const std::string& dir, std::shared_ptr<Store>& opened) {
    auto s = open();
    if (s) {
      opened = std::move(s.value());
      return "open";
    }
    if (s.status().code() == Code::kNotFound) return "missing";
    log_once(LogLevel::kWarn, "store-open:" + dir,
             "cache at " + dir + " is unusable (" + s.status().to_string() + "); serving eager");
    return "unavailable: " + s.status().to_string();
  }
};

KernelTable::KernelTable(std::string dir, bool readonly, int catch_up_ms, int store_wait_ms, StoreOpener opener)
    : dir_(std::move(dir)),
      readonly_(readonly),
      catch_up_every_(catch_up_ms),
      store_wait_(std::max(0, store_wait_ms)),
      store_(std::make_shared<StoreThread>()) {
  store_->catch_up_every = catch_up_every_;
  if (!opener) {
    opener = [dir = dir_, readonly] {
      return Store::open(dir, readonly ? Store::Mode::kReadOnly : Store::Mode::kReader);
    };
  }
  opener_ = std::move(opener);
}

KernelTable::~KernelTable() { retire(); }

void KernelTable::retire() {
  std::unique_lock<std::mutex> g(store_->mu);
  store_->stop = true;
  store_->cv.notify_all();
  std::thread th = std::move(thread_);   // taken under the lock: a second retire finds nothing to join
  if (!th.joinable()) return;
  // A thread stuck inside RocksDB cannot be interrupted; it keeps its shared state alive and is
  // left behind rather than holding up whoever retires the table.
  bool exited = store_->cv.wait_for(g, std::chrono::seconds(1), [&] { return store_->exited; });
  g.unlock();
  if (exited) th.join();
  else th.detach();
}

void KernelTable::refresh() {
  StoreThread& t = *store_;
  std::unique_lock<std::mutex> g(t.mu);
  if (t.stop) return;
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread(StoreThread::run, store_, opener_, dir_);
    } catch (const std::exception& e) {   // std::system_error: no threads left in this process
      t.state = std::string("unavailable: cannot start the store thread: ") + e.what();
      log_once(LogLevel::kWarn, "store-thread:" + dir_, "cache at " + dir_ + ": " + t.state + "; serving eager");
      t.stop = true;
      return;
    }
  }
  auto now = std::chrono::steady_clock::now();
  if (t.busy && now - t.busy_since >= store_wait_) return;   // still stuck on an earlier request
  uint64_t target = ++t.requested;
  t.cv.notify_all();
  if (!t.cv.wait_for(g, store_wait_, [&] { return t.done >= target || t.stop; })) {
    log_once(LogLevel::kWarn, "store-slow:" + dir_,
             "cache at " + dir_ + " did not answer within " + std::to_string(store_wait_.count()) +
                 " ms; serving what is loaded (and eager otherwise) until it does");
  }
}

KernelTable::Lookup KernelTable::find(const std::string& key) {
  // Misses are where kernels written by other processes show up: look for them when one is due.
  auto due = [this] {
    return catch_up_every_.count() > 0 &&
           std::chrono::steady_clock::now().time_since_epoch().count() >= next_catch_up_.load(std::memory_order_relaxed);
  };
  if (store_->has_revoked.load(std::memory_order_relaxed)) drop_revoked();   // the hit path's only extra cost
  {
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      const Entry& e = it->second;
      switch (e.kind) {
        case Kind::kServe: return {Kind::kServe, e.kernel, nullptr, false};
        case Kind::kDisabled: return {Kind::kDisabled, nullptr, nullptr, false};
        case Kind::kEagerBest: return {Kind::kEagerBest, nullptr, nullptr, false};
        case Kind::kLoad:
          // A deferred record read before the last catch-up may be stale: read the store again.
          if (e.deferred && e.gen == store_->gen.load(std::memory_order_relaxed)) {
            g.unlock();
            return claim_deferred(key);
          }
          if (e.deferred) break;
          [[fallthrough]];
        default:
          // kMiss (or a kLoad someone else is doing): trust it until a catch-up may have changed it.
          if ((e.gen == store_->gen.load(std::memory_order_relaxed) && !due()) || catch_up_every_.count() <= 0)
            return {e.kind == Kind::kLoad ? Kind::kDisabled : Kind::kMiss, nullptr, nullptr, false};
      }
    }
  }
  maybe_catch_up();   // rate-limited inside; the first call opens the store
  return consult_store(key);
}

void KernelTable::maybe_catch_up() {
  {
    std::unique_lock<std::mutex> g(due_mu_, std::try_to_lock);
    if (!g.owns_lock()) return;   // someone else is asking; never make a caller wait for that
    auto now = std::chrono::steady_clock::now();
    if (tried_ && (catch_up_every_.count() <= 0 || now - last_try_ < catch_up_every_)) return;
    tried_ = true;
    last_try_ = now;
    next_catch_up_.store((now + catch_up_every_).time_since_epoch().count(), std::memory_order_relaxed);
  }
  refresh();   // the first one opens the store
}

KernelTable::Lookup KernelTable::consult_store(const std::string& key) {
  Lookup out;
  Kind kind = Kind::kMiss;
  std::shared_ptr<Store> store;
  {
    std::lock_guard<std::mutex> g(store_->mu);
    store = store_->store;
  }
  uint64_t gen = store_->gen.load();   // before the read: a refresh after it makes this entry stale
  {
    if (store) {
      auto bytes = store->get(key);   // RocksDB reads are safe alongside the thread's catch-up
      if (bytes) {
        auto rec = decode_record(bytes.value());
        if (!rec) {
          log_once(LogLevel::kWarn, "bad-record:" + key,
                   "cache record is unreadable (" + rec.status().to_string() + "); serving eager for it");
          kind = Kind::kDisabled;
        } else if (rec->state == RecordState::kServed && !rec->blob.empty()) {
          kind = Kind::kLoad;
          out.record = std::make_shared<const Record>(std::move(rec.value()));
        } else if (rec->state == RecordState::kEagerBest) {
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
  auto [it, inserted] = entries_.try_emplace(key, Entry{kind, gen, nullptr, nullptr});
  if (!inserted) {
    if (it->second.kind == Kind::kServe) return {Kind::kServe, it->second.kernel, nullptr, false};
    if (it->second.kind == Kind::kLoad && !it->second.deferred)
      return {Kind::kDisabled, nullptr, nullptr, false};  // another thread loads
    it->second.deferred.reset();   // stale: this read replaces it
    out.first_miss = false;
    it->second.kind = kind;
    it->second.gen = gen;
  } else {
    out.first_miss = (kind == Kind::kMiss);
  }
  out.kind = kind;
  return out;
}

void KernelTable::install(std::shared_ptr<LoadedKernel> k) {
  {
    std::lock_guard<std::mutex> g(store_->mu);
    store_->watched[k->key] = k->record;
    store_->cv.notify_all();   // the store thread starts rechecking on its schedule
  }
  std::unique_lock<std::shared_mutex> g(mu_);
  std::string key = k->key;
  entries_[key] = Entry{Kind::kServe, store_->gen.load(), std::move(k), nullptr};
}

void KernelTable::drop_revoked() {
  StoreThread::Revoked revoked;
  {
    std::lock_guard<std::mutex> g(store_->mu);
    revoked.swap(store_->revoked);
    store_->has_revoked.store(false, std::memory_order_relaxed);
  }
  for (const auto& [key, record] : revoked) {
    {
      std::unique_lock<std::shared_mutex> g(mu_);
      auto it = entries_.find(key);
      // Only the kernel that was checked: one installed since then is for the current record.
      if (it == entries_.end() || it->second.kind != Kind::kServe || it->second.kernel->record != record) continue;
      entries_.erase(it);   // the next call reads the store: a miss, eager_best, disabled or a new kernel
    }
    log(LogLevel::kInfo, "cache record for " + key + " was removed or changed; no longer serving its kernel");
  }
}

void KernelTable::unwatch(const std::string* key) {
  std::lock_guard<std::mutex> g(store_->mu);
  if (key) store_->watched.erase(*key);
  else store_->watched.clear();
}

void KernelTable::disable(const std::string& key, const std::string& why) {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_[key] = Entry{Kind::kDisabled, store_->gen.load(), nullptr, nullptr};
  }
  unwatch(&key);
  log_once(LogLevel::kWarn, "disabled:" + key, "kernel disabled, serving eager (" + why + ") for key " + key);
}

void KernelTable::demote(const std::string& key, const std::string& why) {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_[key] = Entry{Kind::kEagerBest, store_->gen.load(), nullptr, nullptr};
  }
  log_once(LogLevel::kWarn, "demoted:" + key, "kernel demoted to eager for this process (" + why + ") for key " + key);
}

KernelTable::Lookup KernelTable::claim_deferred(const std::string& key) {
  std::unique_lock<std::shared_mutex> g(mu_);
  auto it = entries_.find(key);
  // Between the two locks another caller may have claimed it (then it loads) or replaced it.
  if (it == entries_.end() || it->second.kind != Kind::kLoad || !it->second.deferred)
    return {it != entries_.end() && it->second.kind == Kind::kServe ? Kind::kServe : Kind::kDisabled,
            it != entries_.end() ? it->second.kernel : nullptr, nullptr, false};
  return {Kind::kLoad, nullptr, std::move(it->second.deferred), false};
}

void KernelTable::defer_load(const std::string& key, std::shared_ptr<const Record> record) {
  std::unique_lock<std::shared_mutex> g(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.kind != Kind::kLoad || !record) return;   // changed meanwhile
  it->second.deferred = std::move(record);
}

void KernelTable::forget(const std::string& key) {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_.erase(key);
  }
  unwatch(&key);
  std::lock_guard<std::mutex> g(due_mu_);
  tried_ = false;   // the next lookup catches up with writers at once
  next_catch_up_.store(0);
}

void KernelTable::forget_all() {
  {
    std::unique_lock<std::shared_mutex> g(mu_);
    entries_.clear();
  }
  unwatch(nullptr);
  std::lock_guard<std::mutex> g(due_mu_);
  tried_ = false;
  next_catch_up_.store(0);
}

std::string KernelTable::store_state() const {
  std::lock_guard<std::mutex> g(store_->mu);
  return store_->state;
}

size_t KernelTable::loaded_count() const {
  std::shared_lock<std::shared_mutex> g(mu_);
  size_t n = 0;
  for (const auto& [k, e] : entries_) n += e.kind == Kind::kServe;
  return n;
}

}  // namespace kc
