// The evaluation sandbox: what a candidate kernel may do in the processes that run it (the
// evaluation child, child.h, and the sanitizers' runner, sanitize_main.cpp). A CPU candidate is
// native code with the user's rights; the sandbox takes away what verification never needs:
//   processes   no fork/vfork/clone of a process, no exec, no new session or process group, no
//               signals, ptrace or memory access to other processes (threads stay: clone with
//               CLONE_THREAD; clone3 answers ENOSYS so glibc falls back to clone, which can be checked)
//   files       no open for writing, creating or truncating, no mkdir/unlink/rename/link/chmod/...
//               (seccomp sees no paths, so there is no scratch directory: whatever a child must write
//               its broker writes, broker.h); reading stays (torch, libraries, /proc), as do writes to
//               descriptors already open (the protocol's pipes, stderr, the memfd a kernel loads from)
//   network     no sockets (the CUDA variant keeps AF_UNIX, which the driver may use)
//   limits      RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE = 0; the address-space cap (memory_cap.h) made
//               hard; setrlimit/prlimit that would change one of these, or another process's
//               limits, are denied (others stay: the CUDA driver raises its descriptor limit)
// A denied system call returns EPERM and is recorded (take_sandbox_violation), so the gauntlet
// rejects the candidate with the call's name as evidence: its forbidden action did not happen.
// The filter is a seccomp program built with libseccomp (loaded with dlopen; without it, or where
// the kernel refuses filters, the limits still apply and apply_sandbox says why). It does not use
// namespaces, which containers and CI machines often do not allow to unprivileged users.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"

#include "runtime/config.h"
#include "runtime/status.h"

namespace kc::evolve {

struct SandboxPolicy {
  bool filter = false;              // the seccomp filter (processes, network, limits, kernel facilities)
  bool filter_writes = true;        // ... and writes by path; false for CUDA (the driver opens
                                    // /dev/nvidia* read-write and may write its JIT cache)
  int64_t cpu_seconds = 0;          // RLIMIT_CPU: this many CPU seconds beyond those used so far (0: as is)
  int64_t file_bytes = 0;           // RLIMIT_FSIZE, above the size of stderr when that is a file (0: as is)
  bool no_core = true;              // RLIMIT_CORE = 0: a crashing candidate leaves no core file behind
  bool lock_address_space = false;  // RLIMIT_AS hard = soft (nothing lifts the cap any more)
  nlohmann::json to_json() const;
};

// RLIMIT_FSIZE of a sandboxed process: a CPU kernel's shared object is tens of KB.
constexpr int64_t kSandboxFileBytes = int64_t{64} << 20;
// RLIMIT_FSIZE of the evaluation child of `c`: kSandboxFileBytes, or more where the sanitizer
// stage must hand its runner an input larger than that as a file.
int64_t sandbox_file_bytes(const OpCall& c);
// RLIMIT_CPU of the sanitizers' runner: one call under AddressSanitizer (its wall clock is limited too).
constexpr int64_t kRunnerCpuSeconds = 300;

// The policy for an evaluation process of a CPU or CUDA candidate under `mode` (config
// "evolve_sandbox"): off: nothing; cpu: filter for CPU candidates, limits for both; all: the
// CUDA variant of the filter for CUDA candidates too. cpu_seconds: see SandboxPolicy.
SandboxPolicy sandbox_policy(EvolveSandbox mode, bool cuda, int64_t cpu_seconds);

// CPU seconds for `wall_s` of work on every online CPU (the child's lifetime bound).
int64_t sandbox_cpu_seconds(double wall_s);

// Applies `p` to this process and every thread it has or will have; irreversible. The limits are
// applied first; kUnavailable when the filter was asked for and could not be installed (no
// libseccomp, a kernel without seccomp), with the reason: the caller logs it and goes on.
Status apply_sandbox(const SandboxPolicy& p);

struct SandboxViolation {
  int syscall = -1;                 // the first denied call's number
  std::string name;                 // ... and its name ("mkdir"), or "syscall <n>"
  int64_t attempts = 0;             // denied calls since the last take
  uint64_t args[3] = {0, 0, 0};     // the first denied call's first three arguments
  nlohmann::json to_json() const;
};
// The system calls the filter denied since the last call (nullopt: none), and resets the record.
std::optional<SandboxViolation> take_sandbox_violation();

}  // namespace kc::evolve
