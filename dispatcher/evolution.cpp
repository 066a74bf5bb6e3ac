// Job submission from the user's process; see evolution.h.
#include "dispatcher/evolution.h"

#include <unistd.h>

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "dispatcher/coordinator.h"
#include "dispatcher/state.h"
#include "runtime/fork.h"
#include "runtime/log.h"
#include "runtime/subprocess.h"
#include "runtime/worker_client.h"

namespace kc::dispatch {
namespace {

using Clock = std::chrono::steady_clock;

struct Pending {
  std::string key;
  int device = 0;
  std::vector<at::Tensor> clones;     // empty when not captured
  std::optional<c10::Event> ready;    // recorded on the caller's stream after the clones
};

// One per process (runtime/fork.h): a fork()ed child gets a fresh submitter, with its own mutexes,
// condition variable and thread, and no jobs; the parent's is left as it was.
class Submitter {
 public:
  static Submitter& get() {
    static constinit PerFork<Submitter> s;   // never destroyed: used until the process ends
    return s.get();
  }

  void push(Pending p) {
    std::lock_guard<std::mutex> g(mu_);
    if (!thread_started_) {
      std::thread([this] { loop(); }).detach();
      thread_started_ = true;
    }
    submitted_.insert(p.key);
    queue_.push_back(std::move(p));
    cv_.notify_one();
  }

  bool wait(double timeout_s) {
    auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      check_job_store();
      int pending = count_pending() + coordinated_waiting();
      if (pending == 0) {
        State::get().table().forget_all();
        return true;
      }
      if (Clock::now() > deadline) return false;
      ensure_worker();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  nlohmann::json status() {
    Config c = State::get().config();
    std::lock_guard<std::mutex> g(mu_);
    return {{"enabled", c.evolve && !c.cache_readonly}, {"submitted", submitted_.size()},
            {"queued", queue_.size()}, {"worker_alive", worker_alive(State::get().table().dir())}, {"worker", worker_exe(c)},
            {"last_error", last_error_}, {"job", coordination_status()}};
  }

 private:
  static std::string worker_exe(const Config& c) { return c.worker.empty() ? default_worker_exe() : c.worker; }

  int count_pending() {
    std::vector<std::string> keys;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!queue_.empty() || busy_) return 1;
      keys.assign(submitted_.begin(), submitted_.end());
    }
    const std::string dir = State::get().table().dir();
    int n = 0;
    for (const auto& k : keys) n += job_pending(dir, k);
    return n;
  }

  void ensure_worker() {
    Config c = State::get().config();
    const std::string dir = State::get().table().dir();
    std::lock_guard<std::mutex> g(spawn_mu_);
    if (worker_pid_ > 0) reap_if_exited(worker_pid_);
    if (worker_alive(dir)) return;
    // Back off while workers keep exiting without finishing our jobs (a broken install must not
    // cost the training job a torch start-up every few seconds): 3 s, doubling to 5 min.
    const int pending = count_pending();
    if (pending < pending_at_spawn_) respawns_ = 0;
    const auto wait = std::chrono::seconds(std::min(300, 3 << std::min(respawns_, 7)));
    if (Clock::now() - last_spawn_ < wait) return;   // one may still be starting up
    if (respawns_ >= 3)
      log_once(LogLevel::kWarn, "worker-respawn", "kernelcraft: evolution workers keep exiting without finishing jobs; "
                                                  "retrying with back-off (see " + dir + "/worker.log)");
    last_spawn_ = Clock::now();
    pending_at_spawn_ = pending;
    ++respawns_;
    auto pid = start_worker(dir, worker_exe(c),
                            {"--settings", evolution_settings(c).dump(), "--idle-s", std::to_string(c.worker_idle_s)});
    if (!pid) {
      std::lock_guard<std::mutex> g2(mu_);
      last_error_ = pid.status().to_string();
      log_once(LogLevel::kWarn, "worker-start", "kernelcraft: cannot start the evolution worker: " + last_error_ +
                                                    "; calls keep running eager");
      return;
    }
    worker_pid_ = pid.value();
    log(LogLevel::kInfo, "kernelcraft: started evolution worker pid " + std::to_string(worker_pid_) + " for " + dir);
  }

  void loop() {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> g(mu_);
        // Wake up now and then without work too: a worker that died while our jobs are pending
        // is replaced here, so a training loop that stopped missing still gets its kernels.
        cv_.wait_for(g, std::chrono::seconds(2), [&] { return !queue_.empty(); });
        if (queue_.empty()) {
          g.unlock();
          check_job_store();   // a hung store call hands its jobs back to this node
          if (count_pending() > 0) ensure_worker();
          continue;
        }
        p = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      submit(p);
      std::lock_guard<std::mutex> g(mu_);
      busy_ = false;
    }
  }

  void submit(Pending& p) {
    Config c = State::get().config();
    Job job;
    job.key = p.key;
    job.device = p.device;
    job.submitter_pid = static_cast<int>(getpid());
    job.submitted_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count();
    job.settings = evolution_settings(c);
    try {
      if (p.ready) p.ready->synchronize();   // the clones are complete; only this thread waits
      if (!p.clones.empty()) {
        std::vector<at::IValue> items;
        for (const auto& t : p.clones) items.emplace_back(t.defined() ? at::IValue(t.cpu()) : at::IValue());
        std::vector<char> bytes = torch::jit::pickle_save(c10::ivalue::Tuple::create(std::move(items)));
        job.inputs.assign(bytes.begin(), bytes.end());
      }
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, std::string("kernelcraft: could not capture inputs for a job: ") + e.what());
      job.inputs.clear();
    }
    p.clones.clear();
    // In a distributed job the key may be searched by another node (dispatcher/coordinator.h),
    // which then calls submit_local only if it should be searched here after all.
    if (coordinate(std::move(job), [this](const Job& j) { submit_local(j); })) return;
    submit_local(job);
  }

  // The job file, and a worker for it; called by this thread or the coordinator's.
  void submit_local(const Job& job) {
    const std::string dir = State::get().table().dir();
    Status s = submit_job(dir, job);
    if (!s && s.code() != Code::kBusy) {
      std::lock_guard<std::mutex> g(mu_);
      last_error_ = s.to_string();
      submitted_.erase(job.key);
      log_once(LogLevel::kWarn, "job-submit", "kernelcraft: cannot submit an evolution job: " + last_error_);
      return;
    }
    ensure_worker();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  std::set<std::string> submitted_;
  bool thread_started_ = false;
  bool busy_ = false;
  std::string last_error_;
  std::mutex spawn_mu_;
  int worker_pid_ = -1;
  Clock::time_point last_spawn_{};
  int respawns_ = 0;            // spawns since our pending jobs last went down
  int pending_at_spawn_ = 0;
};

}  // namespace

void request_evolution(const std::string& key, bool cuda, int device, const std::vector<const at::Tensor*>& inputs) {
  try {
    Config c = State::get().config();
    if (!c.evolve || c.cache_readonly) return;
    Pending p;
    p.key = key;
    p.device = device;
    int64_t bytes = 0;
    for (const at::Tensor* t : inputs)
      if (t->defined()) bytes += t->numel() * t->element_size();
    if (bytes <= static_cast<int64_t>(c.evolve_capture_mb) * (1 << 20)) {
      for (const at::Tensor* t : inputs) p.clones.push_back(t->defined() ? t->clone() : at::Tensor());
      if (cuda) {
        const c10::Device d(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
        c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(d);
        p.ready.emplace(c10::DeviceType::CUDA);
        p.ready->record(s);
      }
    }
    Submitter::get().push(std::move(p));
  } catch (const std::exception& e) {
    log_once(LogLevel::kWarn, "evolve-request", std::string("kernelcraft: evolution request failed: ") + e.what());
  }
}

bool wait_for_evolution(double timeout_s) { return Submitter::get().wait(timeout_s); }

nlohmann::json evolution_status() { return Submitter::get().status(); }

}  // namespace kc::dispatch
