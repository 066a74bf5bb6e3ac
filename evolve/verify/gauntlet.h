// The verification gauntlet: cheap to expensive, fail fast, every stage a typed outcome with
// evidence (docs/DESIGN.md "Verification"; docs/DEFECTS.md for what each stage catches). Runs in
// the evaluation child (never in a user's process): a candidate that faults there ends that
// process only.
//
// Stages, in order:
//   static     source rules (static_check.h): device state, clocks, L2 tricks, precision, host calls
//   compile    NVRTC / host compiler; resource use (registers, smem, spills) from the binary; CPU
//              shared objects judged on imports, load-time code and syscalls (binary_check.h)
//   load       launch spec resolved for the key; module loaded; entry points found
//   numerics   every input set (captured, normal, large, offset, extreme, special): outputs poisoned
//              (NaN) before each call, scratch poisoned, shared memory scrubbed (CUDA), inputs
//              compared bit for bit after the call, errors against fp64 within a budget derived
//              from eager's own error, non-finite values where eager has them and only there,
//              denormals not flushed; repeated calls within the budget
//   timing     candidate and eager, same inputs, L2 flushed, events, medians (runtime/timing.h);
//              in full mode interleaved, pair by pair, so both see the same machine
//   recheck    (after timing, i.e. after hundreds of calls) fresh inputs again: state drift, caches
//   sandbox    (only when rejected) the candidate made a system call the sandbox denied (sandbox.h)
//   sanitizer  ("full" mode) compute-sanitizer memcheck, racecheck, initcheck, synccheck on the
//              candidate in a child with exact-size buffers (CPU: AddressSanitizer)
#pragma once
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"
#include "evolve/verify/stage.h"
#include "runtime/status.h"
#include "runtime/timing.h"

namespace kc::evolve {

struct InputSet;   // numerics.h
class Broker;

struct GauntletOptions {
  int repeats = 3;                    // calls on the normal set compared with each other
  double timing_budget_ms = 60;       // per timed side (candidate, eager)
  int recheck_calls = 200;            // extra calls before the recheck in full mode,
  double recheck_budget_ms = 5000;    // at most this long's worth of them (at least 10)
  std::string sanitizer;              // compute-sanitizer executable ("" = $KERNELCRAFT_SANITIZER or PATH)
  std::string sanitize_exe;           // kernelcraft-sanitize (the exact-size runner)
  std::string work_dir;               // where sanitizer bundles are written
  double sanitizer_timeout_s = 120;
  std::vector<std::string> sanitizer_tools = {"memcheck", "racecheck", "initcheck", "synccheck"};
  // Called at each stage's start and before each candidate call with where the gauntlet is
  // ({"stage", "set", "call"}): the evaluation child reports it, so that a candidate that kills
  // the process is blamed with the stage, input set and call it died in.
  std::function<void(const nlohmann::json&)> progress;
  int64_t sanitizer_rss_mb = 0;       // the CPU runner's resident-memory limit (AddressSanitizer's; 0: none)
  // A sandboxed child's broker (broker.h; not owned): CPU compiles and the sanitizer stage run
  // there, since the child may not start processes. nullptr: both run in this process.
  Broker* broker = nullptr;
};

struct Verdict {
  bool verified = false;
  std::optional<StageId> stage;       // the stage that rejected (none when verified)
  std::vector<StageReport> stages;
  double median_ms = 0, mad_ms = 0, eager_median_ms = 0, eager_mad_ms = 0;
  // Full mode: candidate and eager timed interleaved (runtime/timing.h PairedTiming); speedup =
  // eager / candidate per pair. 0 pairs in search mode, where eager's time is measured once.
  int pairs = 0;
  double speedup_median = 0, speedup_p10 = 0, wins = 0;
  // Full mode: the device's copy bandwidth in GB/s, timed in the same window (0: not measured).
  double copy_gb_s = 0;
  // The binary the stages ran (compile stage evidence "binary_hash" is its hash): what promotion
  // stores, so that no other build of the source is ever served. Not part of to_json().
  std::string binary;
  nlohmann::json to_json() const;
  const StageReport* rejection() const;
};

class Gauntlet {
 public:
  // Builds the reference input sets for `call` (captured inputs first, if their metadata matches)
  // with eager and fp64 outputs and error budgets. kUnavailable without the call's device.
  static Result<std::unique_ptr<Gauntlet>> create(OpCall call, int device, std::vector<at::Tensor> captured,
                                                  GauntletOptions o);
  ~Gauntlet();
  // Every stage of gauntlet_stages() that runs in `mode` (stage.h), in order, until one rejects;
  // `set` is the input set of the sanitize mode's replay.
  Verdict run(const std::string& source, const nlohmann::json& launch, Mode mode, const std::string& set = "normal");
  // Eager's time on the normal input set (measured once, on first use).
  Result<Timing> eager_timing();
  const OpCall& call() const;
  // True after a device fault (the CUDA context is unusable) or once the broker is gone: the
  // process must exit.
  bool context_lost() const;
  // The input sets' names, for reports.
  std::vector<std::string> set_names() const;
  // True when the sets are kept for every candidate, false when each stage rebuilds the one it
  // needs (memory_cap.h sets_resident): what a large key's time per candidate depends on.
  bool sets_resident() const;

  struct Impl;   // the gauntlet's state (gauntlet_impl.h)
  struct Run;    // one run's state, which the stages share (gauntlet_run.h)

 private:
  explicit Gauntlet(std::unique_ptr<Impl> p);
  std::unique_ptr<Impl> p_;
};

}  // namespace kc::evolve
