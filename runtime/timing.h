// The one benchmark routine: every GPU (and CPU) timing in kernelcraft goes through here, so
// candidates and eager are always measured the same way.
#pragma once
#include <functional>
#include <vector>

#include "runtime/status.h"

namespace kc {

struct Timing {
  double median_ms = 0;     // per call
  double p10_ms = 0, p90_ms = 0;
  double min_ms = 0, mean_ms = 0;
  double mad_ms = 0;        // median absolute deviation from the median
  int reps = 0;             // timed samples
  int calls_per_rep = 1;    // graph mode: calls replayed per sample (times above are divided by it)
  bool graph = false;
  bool cache_flushed = false;  // L2 (GPU) / last-level cache (CPU) flushed before every sample
};

struct TimingOptions {
  int warmup = 3;             // untimed calls first (also give the time estimate)
  double budget_ms = 100;     // wall-time target for the timed phase, flushes included
  int min_reps = 10;          // taken even when over budget
  int max_reps = 1000;
  bool flush_cache = true;    // write a buffer twice the L2 (GPU) / LLC (CPU) before each sample
  bool graph = false;         // CUDA only: capture calls into a graph and time replays
  int graph_calls = 0;        // calls per graph; 0 = enough for about 1 ms per replay (10..1000)
};

// Times `enqueue`, which must only enqueue its work on `stream` (a CUstream; nullptr is the legacy
// default stream) and return without synchronizing. The stream's context (for nullptr, the
// current one) is used. Each sample: cache flush (cuMemsetD8Async on the stream), event, call,
// event, cuCtxSynchronize, elapsed time. Graph mode needs a non-null stream and a callable that
// is capturable (no synchronization, no allocation; thread-local capture mode); the L2 is flushed
// before each replay, not between the calls inside one. Errors of the callable are returned as
// they are; driver errors (including faults of the timed kernel) are kLaunchError.
Result<Timing> time_cuda(void* stream, const std::function<Status()>& enqueue, const TimingOptions& o = {});

// The CPU twin with steady_clock: `fn` runs the work to completion.
Result<Timing> time_cpu(const std::function<Status()>& fn, const TimingOptions& o = {});

// Two callables timed interleaved in one window: a, b, b, a, a, b, ... (the order inside a pair
// alternates), each sample after its own cache flush. Whatever drifts while they run (clocks, other
// load, the caller's nice level and duty cycle) hits both alike, which a time measured once and
// reused later cannot promise: a candidate promoted on a stale, inflated eager time was slower than
// eager where it was served.
struct PairedTiming {
  Timing a, b;                 // each side's per-call statistics
  int pairs = 0;
  double ratio_median = 0;     // median over pairs of b / a: how many times faster a was than b
  double ratio_p10 = 0;        // 10th percentile of b / a
  double wins = 0;             // fraction of the pairs in which a was faster than b
};
// `a` and `b` as for time_cuda (enqueue only, on `stream`); graph mode is not offered.
Result<PairedTiming> time_paired_cuda(void* stream, const std::function<Status()>& a, const std::function<Status()>& b,
                                      const TimingOptions& o = {});
// The CPU twin: each callable runs its work to completion.
Result<PairedTiming> time_paired_cpu(const std::function<Status()>& a, const std::function<Status()>& b,
                                     const TimingOptions& o = {});

// One call, timed where it runs: CUDA events around `enqueue` on `stream`, then a wait for the end
// event (for the serving path's probe: the caller's own stream, no flush); or the CPU clock.
Result<double> time_once_cuda(void* stream, const std::function<Status()>& enqueue);
Result<double> time_once_cpu(const std::function<Status()>& fn);

// Order statistics of per-call samples in ms (reps = samples.size(); other fields untouched).
Timing summarize(std::vector<double> samples_ms);

}  // namespace kc
