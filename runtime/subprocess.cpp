// posix_spawn-based process runner: no shell (no injection), own process group (clean timeouts).
#include "runtime/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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
  posix_spawn_file_actions_addopen(&sa.fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&sa.fa, 1, 2);
  // The host process (torch, python) may block signals in this thread or ignore SIGPIPE; the
  // compiler must start with a clean slate and in its own group so a timeout kills cc1plus too.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&sa.attr, &none);
  posix_spawnattr_setsigdefault(&sa.attr, &defaults);
  posix_spawnattr_setpgroup(&sa.attr, 0);
  posix_spawnattr_setflags(&sa.attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);

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

}  // namespace kc
