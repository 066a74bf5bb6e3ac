// The backend interface: compile source to a binary, load a binary, launch a resolved spec.
// One implementation per device kind (cpu_backend.h, cuda_backend.h); no torch in here.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/launch_spec.h"
#include "runtime/status.h"

namespace kc {

// The kinds of backend. Code branches on this enum; its names appear only where a backend is
// written down (keys' targets, records, JSON, the CLI). A new kind is a new <kind>_backend.{h,cpp}
// plus one case in backend_for (backend.cpp) and in the target parser (kernel_cache/key.h).
enum class BackendKind { kCpu, kCuda };
const char* backend_name(BackendKind k);                             // "cpu" | "cuda"
std::optional<BackendKind> backend_from_name(std::string_view name);   // nullopt for anything else

struct CompileOutput {
  std::string binary;     // shared object (cpu) or CUBIN (cuda)
  std::string log;        // compiler diagnostics, kept for the record
  double millis = 0;      // wall time of the compile
};

// Runs fn(begin, end) over [0, n) possibly in parallel; the dispatcher passes at::parallel_for.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>& fn)>;

struct ExecContext {
  void* stream = nullptr;          // cuda: CUstream of the caller (PyTorch's current stream)
  ParallelFor parallel_for;        // cpu: may be empty (then serial)
};

// A loaded binary with its entry points resolved for one spec; launching is thread-safe.
class Launcher {
 public:
  virtual ~Launcher() = default;
  // Launches every entry of the spec in order. ptrs has spec.num_slots() entries.
  virtual Status run(void* const* ptrs, const ExecContext& ctx) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  const char* name() const { return backend_name(kind()); }
  // A string naming the target and toolchain (e.g. "cpu-x86_64+gcc-12.2", "cuda-sm_90+nvrtc-13.0");
  // part of every key so binaries are never served across architectures or toolchains.
  virtual std::string target_id() const = 0;
  virtual Result<CompileOutput> compile(const std::string& source) = 0;
  // Loads `binary`, looks up every entry named in `spec`. Fails with kLaunchError on bad binaries.
  virtual Result<std::unique_ptr<Launcher>> load(const std::string& binary, const ResolvedSpec& spec) = 0;
};

// The backend of `kind` for `device` (an ordinal; the CPU has only 0): the one place an
// implementation is chosen. kUnavailable where that kind cannot run here (no driver, no GPU).
Result<Backend*> backend_for(BackendKind kind, int device);

}  // namespace kc
