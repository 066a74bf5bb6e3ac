// posix_spawn-based process runner: no shell (no injection), own process group (clean timeouts).
#include "runtime/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

extern char** environ;

namespace kc {
namespace {

// posix_spawn's C structures need explicit destruction on every path.
struct SpawnAttrs {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  SpawnAttrs() {
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
  }
  ~SpawnAttrs() {
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
  }
};

std::vector<std::string> merged_env(const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& x : extra)
      if (x.compare(0, key.size() + 1, key + "=") == 0) replaced = true;
    if (!replaced) out.push_back(std::move(kv));
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// The host process (torch, python) may block signals in this thread or ignore SIGPIPE; children
// start with a clean slate.
void clean_signals(SpawnAttrs& sa, short extra_flags) {
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&sa.attr, &none);
  posix_spawnattr_setsigdefault(&sa.attr, &defaults);
  posix_spawnattr_setflags(&sa.attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | extra_flags);
}

}  // namespace

std::vector<std::string> split_command(const std::string& cmd) {
  std::vector<std::string> out;
  std::istringstream ss(cmd);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

Result<ProcessResult> run_process(const std::vector<std::string>& argv, const ProcessOptions& o) {
  if (argv.empty()) return Status::error(Code::kInvalid, "run_process: empty command");
  SpawnAttrs sa;
  const char* out = o.output_path.empty() ? "/dev/null" : o.output_path.c_str();
  posix_spawn_file_actions_addopen(&sa.fa, 0, "/dev/null", O_RDONLY, 0);
  // O_NOFOLLOW here and below: logs land in shared places (temp dirs, the cache directory), where a
  // planted symlink must make the spawn fail rather than truncate or append to its target.
  posix_spawn_file_actions_addopen(&sa.fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
  posix_spawn_file_actions_adddup2(&sa.fa, 1, 2);
  // Its own group, so a timeout kills cc1plus too.
  posix_spawnattr_setpgroup(&sa.attr, 0);
  clean_signals(sa, POSIX_SPAWN_SETPGROUP);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env = merged_env(o.env);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &sa.fa, &sa.attr, args.data(), envp.data());
  if (rc != 0)
    return Status::error(Code::kUnavailable, "cannot run '" + argv[0] + "': " + std::strerror(rc));

  ProcessResult r;
  auto deadline = t0 + std::chrono::duration<double>(o.timeout_s);
  auto nap = std::chrono::microseconds(500);
  for (;;) {
    int st = 0;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      r.exited = WIFEXITED(st);
      r.exit_code = r.exited ? WEXITSTATUS(st) : -1;
      r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      break;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {  // ECHILD: the host ignores SIGCHLD, so the kernel reaped the child for us
      r.status_known = false;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      return Status::error(Code::kTimeout, "'" + argv[0] + "' ran longer than " +
                                               std::to_string(o.timeout_s) + " s and was killed");
    }
    std::this_thread::sleep_for(nap);
    if (nap < std::chrono::milliseconds(20)) nap *= 2;
  }
  r.millis = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

namespace {

Result<int> spawn_with(SpawnAttrs& sa, const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env = merged_env(extra_env);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &sa.fa, &sa.attr, args.data(), envp.data());
  if (rc != 0) return Status::error(Code::kUnavailable, "cannot run '" + argv[0] + "': " + std::strerror(rc));
  return static_cast<int>(pid);
}
}  // namespace

Result<std::unique_ptr<PipedChild>> PipedChild::spawn(const std::vector<std::string>& argv,
                                                      const std::vector<std::string>& env,
                                                      const std::string& stderr_path) {
  if (argv.empty()) return Status::error(Code::kInvalid, "spawn: empty command");
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return Status::error(Code::kIOError, "pipe");
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return Status::error(Code::kIOError, "pipe");
  }
  SpawnAttrs sa;
  posix_spawn_file_actions_adddup2(&sa.fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&sa.fa, from_child[1], 1);
  if (!stderr_path.empty())
    posix_spawn_file_actions_addopen(&sa.fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
  posix_spawnattr_setpgroup(&sa.attr, 0);
  clean_signals(sa, POSIX_SPAWN_SETPGROUP);
  auto pid = spawn_with(sa, argv, env);
  close(to_child[0]);
  close(from_child[1]);
  if (!pid) {
    close(to_child[1]);
    close(from_child[0]);
    return pid.status();
  }
  std::unique_ptr<PipedChild> c(new PipedChild());
  c->pid_ = pid.value();
  c->in_ = to_child[1];
  c->out_ = from_child[0];
  return c;
}

PipedChild::~PipedChild() {
  if (in_ >= 0) close(in_);
  if (out_ >= 0) close(out_);
  if (!reaped_ && pid_ > 0) {
    kill_group();
    wait(2);
  }
}

Status PipedChild::write_line(const std::string& line) {
  std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    // A dead child gives POLLERR here; the worker ignores SIGPIPE, so a race past the poll is EPIPE.
    pollfd p{in_, POLLOUT, 0};
    if (poll(&p, 1, 5000) <= 0 || (p.revents & (POLLERR | POLLHUP)))
      return Status::error(Code::kIOError, "child's input closed");
    ssize_t n = ::write(in_, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::error(Code::kIOError, std::string("write to child: ") + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  return Status::ok();
}

Result<std::string> PipedChild::read_line(double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::error(Code::kTimeout, "no answer from the child");
    pollfd p{out_, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char chunk[65536];
    ssize_t n = ::read(out_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::error(Code::kNotFound, "child closed its output");
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

void PipedChild::kill_group() {
  if (pid_ > 0 && !reaped_) ::kill(-pid_, SIGKILL);
}

ProcessResult PipedChild::wait(double timeout_s) {
  ProcessResult r;
  if (reaped_ || pid_ <= 0) return r;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int st = 0;
    pid_t w = waitpid(pid_, &st, WNOHANG);
    if (w == pid_) {
      reaped_ = true;
      r.exited = WIFEXITED(st);
      r.exit_code = r.exited ? WEXITSTATUS(st) : -1;
      r.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
      return r;
    }
    if (w < 0 && errno != EINTR) {
      reaped_ = true;
      r.status_known = false;
      return r;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill_group();
      deadline += std::chrono::seconds(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Result<int> spawn_detached(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                           const std::string& log_path) {
  if (argv.empty()) return Status::error(Code::kInvalid, "spawn: empty command");
  SpawnAttrs sa;
  posix_spawn_file_actions_addopen(&sa.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&sa.fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&sa.fa, 2, log_path.empty() ? "/dev/null" : log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
  // A new session: the worker is not in the user's process group, so a Ctrl-C of the training job
  // does not kill it mid-write, and it never receives the job's terminal signals.
  clean_signals(sa, POSIX_SPAWN_SETSID);
  return spawn_with(sa, argv, env);
}

bool reap_if_exited(int pid) {
  int st = 0;
  return pid > 0 && waitpid(pid, &st, WNOHANG) == pid;
}

}  // namespace kc
