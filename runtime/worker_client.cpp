// Job files, the worker lock and worker start-up; see worker_client.h.
#include "runtime/worker_client.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/fsutil.h"
#include "runtime/subprocess.h"

namespace kc {

std::string jobs_dir(const std::string& cache_dir) { return cache_dir + "/jobs"; }

std::string job_path(const std::string& cache_dir, const std::string& key) {
  return jobs_dir(cache_dir) + "/" + fnv1a64_hex(key) + ".job";
}

Status submit_job(const std::string& cache_dir, const Job& job) {
  const std::string dir = jobs_dir(cache_dir);
  if (!make_dirs(dir)) return Status::error(Code::kIOError, "cannot create " + dir + ": " + std::strerror(errno));
  const std::string final_path = job_path(cache_dir, job.key);
  if (path_exists(final_path)) return Status::error(Code::kBusy, "already pending");
  nlohmann::json j = {{"format", 1}, {"key", job.key}, {"device", job.device},
                      {"inputs", nlohmann::json::binary_t(std::vector<uint8_t>(job.inputs.begin(), job.inputs.end()))},
                      {"settings", job.settings},
                      {"submitted_unix_ms", job.submitted_unix_ms}, {"submitter_pid", job.submitter_pid}};
  std::vector<uint8_t> bytes = nlohmann::json::to_cbor(j);
  const std::string tmp = dir + "/.tmp-" + std::to_string(getpid()) + "-" + fnv1a64_hex(job.key);
  if (!write_file(tmp, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()))) {
    unlink(tmp.c_str());
    return Status::error(Code::kIOError, "cannot write " + tmp);
  }
  // link() fails with EEXIST when another process submitted the same key first: one search per key.
  int rc = link(tmp.c_str(), final_path.c_str());
  int err = errno;
  unlink(tmp.c_str());
  if (rc != 0 && err == EEXIST) return Status::error(Code::kBusy, "already pending");
  if (rc != 0) return Status::error(Code::kIOError, "cannot create " + final_path + ": " + std::strerror(err));
  return Status::ok();
}

bool job_pending(const std::string& cache_dir, const std::string& key) {
  return path_exists(job_path(cache_dir, key));
}

Result<Job> read_job(const std::string& path) {
  bool ok = false;
  std::string bytes = read_file(path, &ok);
  if (!ok) return Status::error(Code::kNotFound, "no job " + path);
  nlohmann::json j = nlohmann::json::from_cbor(bytes, true, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("key"))
    return Status::error(Code::kCorrupt, "job file " + path + " does not parse");
  try {
    Job job;
    job.key = j.at("key").get<std::string>();
    job.device = j.value("device", 0);
    if (j.contains("inputs") && j["inputs"].is_binary()) {
      const auto& b = j["inputs"].get_binary();
      job.inputs.assign(b.begin(), b.end());
    }
    job.settings = j.value("settings", nlohmann::json::object());
    job.submitted_unix_ms = j.value("submitted_unix_ms", int64_t{0});
    job.submitter_pid = j.value("submitter_pid", 0);
    return job;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kCorrupt, std::string("job file: ") + e.what());
  }
}

std::vector<std::string> list_jobs(const std::string& cache_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const std::string dir = jobs_dir(cache_dir);
  list_dir(dir, [&](const std::string& name) {
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".job") != 0 || name[0] == '.') return;
    struct stat st{};
    std::string p = dir + "/" + name;
    if (stat(p.c_str(), &st) == 0) found.emplace_back(static_cast<int64_t>(st.st_mtime), p);
  });
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace {
std::string lock_path(const std::string& cache_dir) { return cache_dir + "/worker.lock"; }
}  // namespace

int worker_pid(const std::string& cache_dir) {
  if (!worker_alive(cache_dir)) return 0;
  std::ifstream f(lock_path(cache_dir));
  int pid = 0;
  f >> pid;
  return pid;
}

bool worker_alive(const std::string& cache_dir) {
  int fd = open(lock_path(cache_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // If we can take a shared lock, no worker holds the exclusive one.
  bool alive = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);   // closing drops our probe lock, if we got it
  return alive;
}

Result<WorkerLock> WorkerLock::acquire(const std::string& cache_dir) {
  if (!make_dirs(cache_dir)) return Status::error(Code::kIOError, "cannot create " + cache_dir);
  int fd = open(lock_path(cache_dir).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Status::error(Code::kIOError, "cannot open " + lock_path(cache_dir));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return Status::error(Code::kBusy, "another worker serves " + cache_dir);
  }
  // The holder's pid, for status and for tests that kill the worker on purpose.
  std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
  }
  return WorkerLock(fd);
}

WorkerLock::~WorkerLock() {
  if (fd_ >= 0) close(fd_);
}

Result<int> start_worker(const std::string& cache_dir, const std::string& worker_exe,
                         const std::vector<std::string>& extra_args) {
  if (worker_exe.empty() || access(worker_exe.c_str(), X_OK) != 0)
    return Status::error(Code::kUnavailable, "no worker executable (" + (worker_exe.empty() ? std::string("unset") : worker_exe) +
                                                 "); set KERNELCRAFT_WORKER");
  if (!make_dirs(cache_dir)) return Status::error(Code::kIOError, "cannot create " + cache_dir);
  // One generation of log is kept: the worker appends a line per candidate, forever otherwise.
  const std::string log_path = cache_dir + "/worker.log";
  struct stat st{};
  if (stat(log_path.c_str(), &st) == 0 && st.st_size > (8 << 20)) rename(log_path.c_str(), (log_path + ".1").c_str());
  std::vector<std::string> argv = {worker_exe, "worker", "--cache-dir", cache_dir};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  return spawn_detached(argv, {}, log_path);
}

std::string default_worker_exe() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&default_worker_exe), &info) == 0 || !info.dli_fname) return "";
  std::string self = info.dli_fname;
  size_t slash = self.rfind('/');
  std::string dir = slash == std::string::npos ? "." : self.substr(0, slash);
  std::string exe = dir + "/kernelcraft";
  return access(exe.c_str(), X_OK) == 0 ? exe : "";
}

}  // namespace kc
