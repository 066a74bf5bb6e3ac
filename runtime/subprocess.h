// Running a helper program (host compiler, sanitizers) without a shell, with a time limit.
#pragma once
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

// Splits a command setting such as "ccache g++" on whitespace (no quoting, no shell).
std::vector<std::string> split_command(const std::string& cmd);

}  // namespace kc
