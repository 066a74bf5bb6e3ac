// The coordinator's state and its thread's steps, shared by its two halves: coordinator.cpp
// (claims, leases, take-over) and coordinator_records.cpp (publishing and importing records, and
// shipping search states). Internal to the dispatcher; the interface is coordinator.h.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatcher/job_store.h"
#include "dispatcher/state.h"
#include "runtime/fork.h"
#include "runtime/status.h"
#include "runtime/worker_client.h"

namespace kc::dispatch::coord {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Store keys under the job prefix (coordinator.h says what each holds).
std::string claim_key(const std::string& key);
std::string record_key(int64_t i);
std::string state_key(const std::string& key);

struct Claim {
  bool present = false;
  std::string owner, state;
};

// A claim's value as read from the store ("": absent).
Claim parse_claim(const std::string& value);

// This process in claims and records: "<host>/<pid>/rank<RANK>".
std::string self_id();

// A key this process missed and does not own: it waits for the claimant's record.
struct Waiting {
  Job job;
  std::string seen;             // the claim's value when last read ("" absent)
  Clock::time_point seen_at{};  // when that value was first seen
};

// A key this process claimed and submitted to its own worker.
struct Owned {
  std::string claim;            // our claim's value in the store
  int64_t beat = 0;
  Clock::time_point renewed{};
  bool lost = false;            // taken over meanwhile (we renewed too late): not renewed again
};

struct Published {
  std::string owner, key, bundle;
};

class Coordinator {
 public:
  void stop(double wait_s);
  static Coordinator& get() {
    static constinit PerFork<Coordinator> c;   // never destroyed: its thread may run until exit
    return c.get();
  }

  bool offer(Job&& job, const std::function<void(const Job&)>& local);
  int waiting() {
    std::lock_guard<std::mutex> g(mu_);
    return static_cast<int>(inbox_.size() + waiting_.size());
  }
  void check_stuck();
  json status();

 private:
  enum class Phase { kNone, kConnecting, kOn, kOff };

  void run();
  Status round(const Config& c);
  Status tend_owned(const Config& c);
  Status renew_due(const Config& c);
  Status tend_waiting(const Config& c);
  Status watch(const std::string& key, const Config& c, Clock::time_point now);
  Status read_records(const Config& c);
  void import(const Published& p);
  void ship_state(const std::string& key);
  void adopt_state(const std::string& key, const std::string& from);
  Status finish(const std::string& key, const Owned& o);
  void give_up(const std::string& why);
  void go_local(const std::string& key);

  std::string claim_value(const std::string& key, int64_t beat, const char* state, bool record = false) const {
    return json{{"key", key}, {"owner", me_}, {"beat", beat}, {"state", state}, {"record", record}}.dump();
  }
  // Every store call goes through here, so a call that hangs is seen by check_stuck().
  template <class F>
  auto call(F f) {
    call_since_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    auto r = f(*store_);
    call_since_.store(0, std::memory_order_relaxed);
    return r;
  }
  bool off() {
    std::lock_guard<std::mutex> g(mu_);
    return phase_ == Phase::kOff;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  Phase phase_ = Phase::kNone;
  JobStoreAddress addr_;
  std::string me_ = self_id();
  std::string error_;
  std::function<void(const Job&)> local_;
  std::deque<Job> inbox_;
  std::map<std::string, Waiting> waiting_;
  std::map<std::string, Owned> owned_;
  std::set<std::string> targets_;              // targets of keys missed here
  std::atomic<int64_t> call_since_{0};         // steady ticks of the store call in flight; 0: none
  int timeout_ms_ = 3000;
  uint64_t claimed_ = 0, taken_over_ = 0, published_ = 0, imported_ = 0, refused_ = 0;
  std::atomic<uint64_t> resumed_{0};   // taken-over keys that resumed from a shipped search state
  std::atomic<bool> stopping_{false};   // process exit: no more rounds, leave the current one
  std::timed_mutex busy_;               // held by the thread for each round

  // The coordinator thread's own.
  std::unique_ptr<JobStore> store_;
  int64_t next_record_ = 0;
  Clock::time_point hole_since_{};             // record/<next_record_> counted but not yet set
  std::vector<Published> stash_;
};


}  // namespace kc::dispatch::coord
