// The worker daemon (run_worker, see worker.h): takes jobs from <cache>/jobs oldest first and runs
// each key's search. Anything in a job file is untrusted input: a job that does not parse or
// validate is moved to jobs/rejected/ with a .reason file beside it and one log line, and the
// worker goes on with the next one. No exception leaves a worker thread.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/ops/op_call.h"
#include "evolve/worker/worker.h"
#include "runtime/cache_dir.h"
#include "runtime/config.h"
#include "runtime/fsutil.h"
#include "runtime/log.h"
#include "runtime/temp_files.h"
#include "runtime/worker_client.h"

namespace kc::evolve {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop{false};
void on_term(int) { g_stop.store(true); }

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Moves `path` into jobs/<folder>/ (rename: never writes through a link; a name already there is
// replaced). Where that fails the job is deleted: it must not be taken again.
void set_aside(const std::string& cache_dir, const std::string& path, const char* folder, const std::string& reason) {
  const std::string dir = jobs_dir(cache_dir) + "/" + folder;
  const std::string dst = dir + "/" + base_name(path);
  Status s = prepare_cache_subdir(dir);
  if (s && rename(path.c_str(), dst.c_str()) == 0) {
    if (!reason.empty()) {
      const std::string why = dst + ".reason";
      unlink(why.c_str());   // an older rejection of the same name; a planted link goes, untouched
      write_new_file(why, reason + "\n").ignore();   // best effort: the log line says it too
    }
    return;
  }
  unlink(path.c_str());
}

// One job, start to end. Returns when the job file has been dealt with (or left for a restart).
void process_job(const EvolveOptions& base, const std::string& path, double gpu_share) {
  auto reject = [&](const std::string& why) {
    log(LogLevel::kWarn, "worker: rejected job " + path + ": " + why + " (moved to jobs/rejected/)");
    set_aside(base.cache_dir, path, "rejected", why);
  };
  auto job = read_job(path);
  if (!job) {
    if (job.status().code() != Code::kNotFound) reject(job.status().to_string());   // kNotFound: taken meanwhile
    return;
  }
  auto opts = job_options(base, job.value());
  if (!opts) return reject(opts.status().to_string());
  EvolveOptions o = std::move(opts.value());
  o.gpu_share = gpu_share;
  o.stop = &g_stop;
  const std::string tag = "[" + fnv1a64_hex(job.value().key).substr(0, 8) + "] ";
  o.progress = [tag](const std::string& s) { log(LogLevel::kWarn, tag + s); };
  log(LogLevel::kWarn, tag + "job " + job.value().key);
  EvolveResult r = evolve_key(job.value().key, path, job.value().device, o);
  log(LogLevel::kWarn, tag + "outcome " + r.to_json().dump());
  if (r.outcome == "stopped") return;   // resumed by the next worker
  // Kept aside for inspection; a later miss may submit it again.
  if (r.outcome == "failed" || r.outcome == "skipped") set_aside(base.cache_dir, path, "failed", r.why);
  else unlink(path.c_str());
}

}  // namespace

Result<EvolveOptions> job_options(const EvolveOptions& base, const Job& job) {
  auto call = call_from_key(job.key);
  if (!call) return Status::error(Code::kInvalid, "key: " + call.status().message());
  EvolveOptions o = base;
  if (Status s = apply_evolve_json(o, job.settings); !s) return s;
  return o;
}

Result<EvolveOptions> check_job_file(const EvolveOptions& base, const std::string& path) {
  auto job = read_job(path);
  if (!job) return job.status();
  return job_options(base, job.value());
}

int run_worker(const EvolveOptions& base, double idle_exit_s) {
  RemoveAtScopeEnd calls(owned_temp_path("calls"));   // temp_call_file()'s directory
  auto lock = WorkerLock::acquire(base.cache_dir);
  if (!lock) {
    log(LogLevel::kInfo, "worker: " + lock.status().message());
    return 0;
  }
  log(LogLevel::kWarn, "worker: pid " + std::to_string(getpid()) + " serving " + base.cache_dir);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  // Below the user's job for the CPU too (compiles, references).
  setpriority(PRIO_PROCESS, 0, load_config().evolve_nice);
  const int threads = std::max(1, base.jobs);
  std::mutex mu;
  std::set<std::string> running;
  auto last_work = Clock::now();
  auto secs_idle = [&] { return std::chrono::duration<double>(Clock::now() - last_work).count(); };
  auto worker_thread = [&] {
    while (!g_stop.load()) {
      std::string path;
      {
        std::lock_guard<std::mutex> g(mu);
        for (const auto& p : list_jobs(base.cache_dir))
          if (!running.count(p)) {
            path = p;
            running.insert(p);
            break;
          }
        if (!path.empty()) last_work = Clock::now();
        else if (running.empty() && secs_idle() > idle_exit_s) return;
      }
      if (path.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      // The budget is the worker's, shared by its searches. An exception escaping a thread ends
      // the process (std::terminate), so whatever a job provokes stops here, with the job.
      try {
        process_job(base, path, base.gpu_share / threads);
      } catch (const std::exception& e) {
        log(LogLevel::kError, "worker: job " + path + " raised " + e.what() + " (moved to jobs/rejected/)");
        set_aside(base.cache_dir, path, "rejected", std::string("internal error: ") + e.what());
      }
      std::lock_guard<std::mutex> g(mu);
      running.erase(path);
      last_work = Clock::now();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker_thread);
  for (auto& t : pool) t.join();
  log(LogLevel::kWarn, "worker: exiting" + std::string(g_stop.load() ? " (asked to stop)" : " (idle)"));
  return 0;
}

}  // namespace kc::evolve
