// Running a helper program (host compiler, sanitizers) without a shell, with a time limit.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace kc {

struct ProcessOptions {
  double timeout_s = 60;          // the whole process group is SIGKILLed after this
  std::string output_path;        // stdout and stderr both go here (truncated); empty: /dev/null
  std::vector<std::string> env;   // "KEY=VALUE" entries added to (or replacing in) the environment
};

struct ProcessResult {
  int exit_code = -1;             // valid when exited
  int signal = 0;                 // the signal that ended it, if any
  bool exited = false;            // ended with exit(); false if killed by a signal
  bool status_known = true;       // false if someone else reaped it (SIGCHLD ignored by the host)
  double millis = 0;
  bool ok() const { return exited && exit_code == 0; }
};

// Runs argv (argv[0] is looked up in PATH) in its own process group with stdin from /dev/null.
// kUnavailable if it cannot be started, kTimeout (group killed) past the limit; a non-zero exit
// is not an error here (see ProcessResult).
Result<ProcessResult> run_process(const std::vector<std::string>& argv, const ProcessOptions& o);

// A long-lived child speaking line-delimited text over pipes (the evolution worker's evaluation
// child). Its own process group; stderr goes to `stderr_path` (appended) or is inherited.
class PipedChild {
 public:
  static Result<std::unique_ptr<PipedChild>> spawn(const std::vector<std::string>& argv,
                                                   const std::vector<std::string>& env,
                                                   const std::string& stderr_path);
  ~PipedChild();   // kills the group if still running
  Status write_line(const std::string& line);
  // One line without its newline; kTimeout after timeout_s, kNotFound at end of stream.
  Result<std::string> read_line(double timeout_s);
  void kill_group();
  // Reaps the child (after kill_group or end of stream); waits at most timeout_s.
  ProcessResult wait(double timeout_s = 5);
  int pid() const { return pid_; }

 private:
  PipedChild() = default;
  int pid_ = -1, in_ = -1, out_ = -1;
  std::string buf_;
  bool reaped_ = false;
};

// Starts argv detached (new session, stdin/stdout /dev/null, stderr appended to log_path) and
// returns its pid without waiting. For the evolution worker, which outlives nothing it needs.
Result<int> spawn_detached(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                           const std::string& log_path);
// Reaps `pid` if it has exited (no wait). True if it was reaped.
bool reap_if_exited(int pid);

// Splits a command setting such as "ccache g++" on whitespace (no quoting, no shell).
std::vector<std::string> split_command(const std::string& cmd);

}  // namespace kc
