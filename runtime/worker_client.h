// The user's side of evolution: job files and the worker's liveness. Torch-free.
//
// A cache directory holds at most one worker (the process holding flock on <cache>/worker.lock).
// Jobs are files <cache>/jobs/<fnv1a64(key)>.job (CBOR: key, device, captured inputs, settings),
// created atomically with link(2): a second submission of the same key from any process finds the
// file and is a no-op, so several training processes never start duplicate searches. The worker
// deletes a job when its search has ended (a record "served" or "eager_best" is in the cache).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace kc {

struct Job {
  std::string key;
  int device = 0;
  std::string inputs;            // torch pickle of the captured inputs (schema order), or empty
  nlohmann::json settings = nlohmann::json::object();   // search options and budget
  int64_t submitted_unix_ms = 0;
  int submitter_pid = 0;
};

constexpr int kJobFormat = 1;
constexpr size_t kMaxJobBytes = size_t{8} << 30;    // far above any capture (evolve_capture_mb)
constexpr size_t kMaxJobKeyBytes = 64 << 10;
constexpr int kMaxDevice = 4095;

std::string jobs_dir(const std::string& cache_dir);
std::string job_path(const std::string& cache_dir, const std::string& key);

// Writes the job; kBusy (not an error for callers) if one for this key is already pending.
Status submit_job(const std::string& cache_dir, const Job& job);
bool job_pending(const std::string& cache_dir, const std::string& key);
// A job file's bytes, validated field by field (types and ranges); kCorrupt / kInvalid with the
// reason for anything else. Never throws. The settings are checked by their reader (the worker).
Result<Job> parse_job(std::string_view bytes);
// read_regular_file (no symlinks) + parse_job.
Result<Job> read_job(const std::string& path);
// Paths of pending jobs, oldest first.
std::vector<std::string> list_jobs(const std::string& cache_dir);

// True if a worker holds this cache's lock (probe without taking it).
bool worker_alive(const std::string& cache_dir);
// The live worker's pid (written into the lock file), or 0.
int worker_pid(const std::string& cache_dir);

// Held by the worker for its lifetime; released by the kernel when the process dies, however.
class WorkerLock {
 public:
  // kBusy if another worker holds it.
  static Result<WorkerLock> acquire(const std::string& cache_dir);
  WorkerLock() = default;
  WorkerLock(WorkerLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  WorkerLock& operator=(WorkerLock&& o) noexcept { std::swap(fd_, o.fd_); return *this; }
  ~WorkerLock();

 private:
  explicit WorkerLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Starts `worker_cmd worker --cache-dir <dir>` detached, logging to <cache>/worker.log.
Result<int> start_worker(const std::string& cache_dir, const std::string& worker_exe,
                         const std::vector<std::string>& extra_args);

// The `kernelcraft` executable installed next to the library this code is linked into, or "".
std::string default_worker_exe();

}  // namespace kc
