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

#include "runtime/cache_dir.h"
#include "runtime/fsutil.h"
#include "runtime/json_util.h"
#include "runtime/subprocess.h"

namespace kc {

std::string jobs_dir(const std::string& cache_dir) { return cache_dir + "/jobs"; }

std::string job_path(const std::string& cache_dir, const std::string& key) {
  return jobs_dir(cache_dir) + "/" + fnv1a64_hex(key) + ".job";
}

Status submit_job(const std::string& cache_dir, const Job& job) {
  KC_RETURN_IF_ERROR(prepare_cache_dir(cache_dir));
  const std::string dir = jobs_dir(cache_dir);
  KC_RETURN_IF_ERROR(prepare_cache_subdir(dir));
  const std::string final_path = job_path(cache_dir, job.key);
  struct stat st{};
  if (lstat(final_path.c_str(), &st) == 0) return Status::error(Code::kBusy, "already pending");
  nlohmann::json j = {{"format", 1}, {"key", job.key}, {"device", job.device},
                      {"inputs", nlohmann::json::binary_t(std::vector<uint8_t>(job.inputs.begin(), job.inputs.end()))},
                      {"settings", job.settings},
                      {"submitted_unix_ms", job.submitted_unix_ms}, {"submitter_pid", job.submitter_pid}};
  std::vector<uint8_t> bytes = nlohmann::json::to_cbor(j);
  const std::string tmp = dir + "/.tmp-" + std::to_string(getpid()) + "-" + fnv1a64_hex(job.key);
  // A leftover of a crashed process with our pid (or a planted symlink) is removed, not written
  // through: unlink removes the link itself, and the file is then created with O_EXCL.
  unlink(tmp.c_str());
  KC_RETURN_IF_ERROR(write_new_file(tmp, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  // link() fails with EEXIST when another process submitted the same key first: one search per key.
  // It never follows a symlink at the destination (an existing name, link or not, is EEXIST).
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

Result<Job> parse_job(std::string_view bytes) {
  auto parsed = parse_cbor(bytes);
  if (!parsed) return parsed.status();
  const nlohmann::json& j = parsed.value();
  if (!j.is_object()) return Status::error(Code::kInvalid, "not a CBOR map");
  int format = 0;
  KC_RETURN_IF_ERROR(read_field(j, "format", format));
  if (format != kJobFormat) return Status::error(Code::kInvalid, "format " + std::to_string(format) + " is not " +
                                                                 std::to_string(kJobFormat));
  Job job;
  KC_RETURN_IF_ERROR(read_field(j, "key", job.key));
  if (job.key.empty() || job.key.size() > kMaxJobKeyBytes) return Status::error(Code::kInvalid, "key: empty or too long");
  KC_RETURN_IF_ERROR(read_field(j, "device", job.device, 0, kMaxDevice));
  if (auto in = j.find("inputs"); in != j.end() && !in->is_null()) {
    if (!in->is_binary()) return Status::error(Code::kInvalid, "inputs: not a byte string");
    job.inputs.assign(in->get_binary().begin(), in->get_binary().end());
  }
  if (auto set = j.find("settings"); set != j.end() && !set->is_null()) {
    if (!set->is_object()) return Status::error(Code::kInvalid, "settings: not a map");
    job.settings = *set;
  }
  KC_RETURN_IF_ERROR(read_field(j, "submitted_unix_ms", job.submitted_unix_ms, int64_t{0}));
  KC_RETURN_IF_ERROR(read_field(j, "submitter_pid", job.submitter_pid, 0));
  return job;
}

Result<Job> read_job(const std::string& path) {
  auto bytes = read_regular_file(path, kMaxJobBytes);
  if (!bytes) return bytes.status();
  auto job = parse_job(bytes.value());
  if (!job) return Status::error(job.status().code(), "job file " + path + ": " + job.status().message());
  return job;
}

std::vector<std::string> list_jobs(const std::string& cache_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const std::string dir = jobs_dir(cache_dir);
  list_dir(dir, [&](const std::string& name) {
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".job") != 0 || name[0] == '.') return;
    struct stat st{};
    std::string p = dir + "/" + name;
    // Regular files only: a symlink named like a job is never read.
    if (lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) found.emplace_back(static_cast<int64_t>(st.st_mtime), p);
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
  auto text = read_regular_file(lock_path(cache_dir), 64);
  return text ? std::atoi(text.value().c_str()) : 0;
}

bool worker_alive(const std::string& cache_dir) {
  int fd = open_nofollow(lock_path(cache_dir), O_RDONLY | O_NONBLOCK);
  if (fd < 0) return false;
  // If we can take a shared lock, no worker holds the exclusive one.
  bool alive = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);   // closing drops our probe lock, if we got it
  return alive;
}

Result<WorkerLock> WorkerLock::acquire(const std::string& cache_dir) {
  KC_RETURN_IF_ERROR(prepare_cache_dir(cache_dir));
  // O_NOFOLLOW: a planted worker.lock symlink must not get its target truncated. The lock file is
  // reused across workers (flock, not existence, is the lock), hence no O_EXCL; it must be a
  // regular file of ours.
  int fd = open_nofollow(lock_path(cache_dir), O_RDWR | O_CREAT | O_NONBLOCK, cache_file_mode());
  if (fd < 0) return Status::error(Code::kIOError, "cannot open " + lock_path(cache_dir) + ": " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (!cache_dir_shared() && st.st_uid != geteuid())) {
    close(fd);
    return Status::error(Code::kInvalid, lock_path(cache_dir) + " is not a regular file of ours; refusing it");
  }
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
  KC_RETURN_IF_ERROR(prepare_cache_dir(cache_dir));
  // One generation of log is kept: the worker appends a line per candidate, forever otherwise.
  // rename() moves names, never writes through a link; spawn_detached opens the log O_NOFOLLOW.
  const std::string log_path = cache_dir + "/worker.log";
  struct stat st{};
  if (lstat(log_path.c_str(), &st) == 0 && st.st_size > (8 << 20)) rename(log_path.c_str(), (log_path + ".1").c_str());
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
