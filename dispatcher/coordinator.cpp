// Job-wide coordination through the job's c10d store, its claims half: claiming missed keys,
// renewing their leases, taking over stale ones, giving the store up. The records half is
// coordinator_records.cpp; the protocol is in coordinator.h.
#include "dispatcher/coordinator.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "dispatcher/coordinator_impl.h"
#include "dispatcher/job_store.h"
#include "dispatcher/state.h"
#include "kernel_cache/key.h"
#include "runtime/fork.h"
#include "runtime/fsutil.h"
#include "runtime/json_util.h"
#include "runtime/log.h"

namespace kc::dispatch {
namespace coord {

std::string self_id() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  const char* rank = std::getenv("RANK");
  return std::string(host) + "/" + std::to_string(getpid()) + "/rank" + (rank ? rank : "?");
}

std::string claim_key(const std::string& key) { return "claim/" + fnv1a64_hex(key); }

Claim parse_claim(const std::string& value) {
  Claim c;
  if (value.empty()) return c;
  c.present = true;
  auto j = parse_json_text(value);
  if (j && j.value().is_object()) {
    c.owner = j.value().value("owner", "");
    c.state = j.value().value("state", "");
  }
  return c;
}

bool Coordinator::offer(Job&& job, const std::function<void(const Job&)>& local) {
  if (fork_generation() != 0) return false;   // a fork()ed child shares its parent's socket: local
  std::lock_guard<std::mutex> g(mu_);
  if (phase_ == Phase::kOff) return false;
  if (phase_ == Phase::kNone) {
    const Config c = State::get().config();
    auto addr = job_store_address(c.job_store);
    if (!addr || !addr.value()) {
      if (!addr) log_once(LogLevel::kWarn, "job-store", "kernelcraft: " + addr.status().message() + "; no job-wide coordination");
      error_ = addr ? "" : addr.status().message();
      phase_ = Phase::kOff;
      return false;
    }
    addr_ = *addr.value();
    timeout_ms_ = c.job_store_timeout_ms;
    local_ = local;
    phase_ = Phase::kConnecting;
    std::thread([this] { run(); }).detach();
  }
  targets_.insert(key_target(job.key));
  inbox_.push_back(std::move(job));
  cv_.notify_one();
  return true;
}

void Coordinator::run() {
  // Below the user's job, like the worker: imports run the host compiler, which inherits this
  // thread's nice value. Failing to lower it costs nothing but priority.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), State::get().config().evolve_nice);
  call_since_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  auto s = JobStore::connect(addr_, std::chrono::milliseconds(timeout_ms_));
  call_since_.store(0, std::memory_order_relaxed);
  if (!s) return give_up(s.status().message());
  store_ = std::move(s.value());
  {
    std::lock_guard<std::mutex> g(mu_);
    if (phase_ == Phase::kOff) return;
    phase_ = Phase::kOn;
  }
  log(LogLevel::kInfo, "kernelcraft: coordinating searches through the job store at " + addr_.to_string() + " as " + me_);
  for (;;) {
    const Config c = State::get().config();
    {
      std::unique_lock<std::timed_mutex> b(busy_);   // blocks for good once stop() holds it
      if (stopping_.load()) return;
      Status st = round(c);
      if (!st) return give_up(st.message());
    }
    std::unique_lock<std::mutex> g(mu_);
    if (phase_ == Phase::kOff) return;   // check_stuck gave up while a call hung
    cv_.wait_for(g, std::chrono::milliseconds(c.job_poll_ms), [&] { return !inbox_.empty() || stopping_.load(); });
  }
}

void Coordinator::stop(double wait_s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_.store(true);
    cv_.notify_all();
  }
  // Kept locked once taken: the thread then never starts another round before the process ends.
  if (!busy_.try_lock_for(std::chrono::duration<double>(wait_s)))
    log(LogLevel::kInfo, "kernelcraft: exiting while the job coordinator is still inside a store call");
}

Status Coordinator::round(const Config& c) {
  {
    std::lock_guard<std::mutex> g(mu_);
    const auto now = Clock::now();
    for (Job& j : inbox_) {
      std::string key = j.key;
      waiting_.emplace(key, Waiting{std::move(j), "\x01", now});   // "\x01": no value read yet
    }
    inbox_.clear();
  }
  KC_RETURN_IF_ERROR(tend_owned(c));
  KC_RETURN_IF_ERROR(tend_waiting(c));
  return read_records(c);
}

// Renews the claims of keys still searched here; publishes those whose search ended.
Status Coordinator::tend_owned(const Config& c) {
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [k, o] : owned_) keys.push_back(k);
  }
  const std::string dir = State::get().table().dir();
  for (const std::string& key : keys) {
    if (stopping_.load()) return Status::ok();
    Owned o;
    {
      std::lock_guard<std::mutex> g(mu_);
      o = owned_[key];
    }
    if (!job_pending(dir, key)) {
      KC_RETURN_IF_ERROR(finish(key, o));
      std::lock_guard<std::mutex> g(mu_);
      owned_.erase(key);
    }
  }
  return renew_due(c);
}

// Renews the claims of owned keys not renewed for a quarter lease. Also called between imports:
// a round that imports many records (each rebuilt by the host compiler) must not let its own
// claims lapse, or a peer takes them over and the keys are searched twice.
Status Coordinator::renew_due(const Config& c) {
  std::vector<std::pair<std::string, Owned>> due;
  const auto renew_every = std::chrono::duration<double>(c.job_lease_s / 4);
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [k, o] : owned_)
      if (!o.lost && Clock::now() - o.renewed >= renew_every) due.emplace_back(k, o);
  }
  for (const auto& [key, o] : due) {
    if (stopping_.load()) return Status::ok();
    const std::string next = claim_value(key, o.beat + 1, "search");
    auto now = call([&](JobStore& s) { return s.compare_set(claim_key(key), o.claim, next); });
    if (!now) return now.status();
    {
      std::lock_guard<std::mutex> g(mu_);
      Owned& mine = owned_[key];
      if (now.value() != next) {
        mine.lost = true;
        log(LogLevel::kInfo, "kernelcraft: the claim on " + key + " was taken over by " +
                                 parse_claim(now.value()).owner + " (renewed too late); the search here carries on");
        continue;
      }
      mine.claim = next;
      mine.beat = o.beat + 1;
      mine.renewed = Clock::now();
    }
    ship_state(key);
  }
  return Status::ok();
}

Status Coordinator::tend_waiting(const Config& c) {
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [k, w] : waiting_) keys.push_back(k);
  }
  for (const std::string& key : keys) {
    if (stopping_.load()) return Status::ok();
    KC_RETURN_IF_ERROR(watch(key, c, Clock::now()));
  }
  return Status::ok();
}

// One waiting key: claim it when nobody has, or when its claim went stale for a lease (its owner
// died or stopped renewing), while this process has capacity (evolve_jobs keys of its own at a
// time, so that the keys of a job spread over its nodes); otherwise note what the claim says.
Status Coordinator::watch(const std::string& key, const Config& c, Clock::time_point now) {
  auto cur = call([&](JobStore& s) { return s.get(claim_key(key)); });
  if (!cur && cur.status().code() != Code::kNotFound) return cur.status();
  const std::string value = cur ? cur.value() : "";
  const Claim claim = parse_claim(value);
  std::unique_lock<std::mutex> g(mu_);
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return Status::ok();   // imported or given up meanwhile
  Waiting& w = it->second;
  if (value != w.seen) {
    w.seen = value;
    w.seen_at = now;
  }
  const bool stale = now - w.seen_at > std::chrono::duration<double>(c.job_lease_s);
  if (claim.present && claim.state == "ended") {
    // Ended without a record reaching us within a lease (the owner's worker gave the key up):
    // nothing is coming, and a search here would end the same way.
    if (stale) waiting_.erase(it);
    return Status::ok();
  }
  const bool free = !claim.present || stale;
  if (!free || owned_.size() >= static_cast<size_t>(std::max(1, c.evolve_jobs))) return Status::ok();
  g.unlock();
  const std::string mine = claim_value(key, 0, "search");
  auto won = call([&](JobStore& s) { return s.compare_set(claim_key(key), value, mine); });
  if (!won) return won.status();
  // Before the key leaves waiting_: until it is a local job, wait_for_evolution must still see it.
  if (won.value() == mine && claim.present) adopt_state(key, claim.owner);
  g.lock();
  it = waiting_.find(key);
  if (it == waiting_.end() || phase_ == Phase::kOff) return Status::ok();
  if (won.value() != mine) {   // another node was first
    it->second.seen = won.value();
    it->second.seen_at = Clock::now();
    return Status::ok();
  }
  Job job = std::move(it->second.job);
  waiting_.erase(it);
  owned_[key] = Owned{mine, 0, Clock::now(), false};
  ++claimed_;
  if (claim.present) {
    ++taken_over_;
    log(LogLevel::kInfo, "kernelcraft: took over " + key + " from " + claim.owner + " (its claim was not renewed for " +
                             std::to_string(c.job_lease_s) + " s); searching it here");
  }
  g.unlock();
  local_(job);
  return Status::ok();
}

// A waiting key is searched here after all.
void Coordinator::go_local(const std::string& key) {
  std::unique_lock<std::mutex> g(mu_);
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  Job job = std::move(it->second.job);
  waiting_.erase(it);
  g.unlock();
  local_(job);
}

void Coordinator::give_up(const std::string& why) {
  std::vector<Job> jobs;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (phase_ == Phase::kOff) return;
    phase_ = Phase::kOff;
    error_ = why;
    for (auto& [k, w] : waiting_) jobs.push_back(std::move(w.job));
    for (Job& j : inbox_) jobs.push_back(std::move(j));
    waiting_.clear();
    inbox_.clear();
  }
  log_once(LogLevel::kWarn, "job-store", "kernelcraft: " + why + "; no job-wide coordination from now on, searches run "
                                         "on this node only");
  for (const Job& j : jobs) local_(j);
}

void Coordinator::check_stuck() {
  const int64_t since = call_since_.load(std::memory_order_relaxed);
  if (since == 0) return;
  const auto started = Clock::time_point(Clock::duration(since));
  if (Clock::now() - started <= std::chrono::milliseconds(timeout_ms_ + 1000)) return;
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g s", timeout_ms_ / 1000.0);
  bool connecting = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    connecting = phase_ == Phase::kConnecting;
  }
  // c10d's connect retries with back-off past its timeout; a stuck connect is an unreachable store.
  give_up("the job store at " + addr_.to_string() +
          (connecting ? std::string(" is unreachable (no connection within ") + secs + ")"
                      : std::string(" stopped answering (a call took over ") + secs + ")"));
}

json Coordinator::status() {
  std::lock_guard<std::mutex> g(mu_);
  const char* names[] = {"none", "connecting", "on", "off"};
  return {{"state", names[static_cast<int>(phase_)]}, {"store", addr_.port ? json(addr_.to_string()) : json(nullptr)},
          {"owner", me_}, {"error", error_}, {"claimed", claimed_}, {"taken_over", taken_over_},
          {"published", published_}, {"imported", imported_}, {"refused", refused_},
          {"resumed", resumed_.load()}, {"waiting", inbox_.size() + waiting_.size()}, {"owned", owned_.size()}};
}

}  // namespace coord

using coord::Coordinator;

bool coordinate(Job&& job, const std::function<void(const Job&)>& local) {
  return Coordinator::get().offer(std::move(job), local);
}

int coordinated_waiting() { return Coordinator::get().waiting(); }

void check_job_store() { Coordinator::get().check_stuck(); }

nlohmann::json coordination_status() { return Coordinator::get().status(); }

void stop_coordination(double wait_s) { Coordinator::get().stop(wait_s); }

}  // namespace kc::dispatch
