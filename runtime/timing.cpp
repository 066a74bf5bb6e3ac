// Benchmarking: warm-up, budget-sized repetitions, cache flush, CUDA events or graph replay, order statistics.
#include "runtime/timing.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/cuda_api.h"
#include "runtime/log.h"

namespace kc {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  double pos = q * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double f = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - f) + sorted[hi] * f;
}

int reps_for(const TimingOptions& o, double sample_ms) {
  double n = o.budget_ms / std::max(sample_ms, 1e-4);
  int reps = n > o.max_reps ? o.max_reps : static_cast<int>(n);
  return std::max(std::max(reps, o.min_reps), 1);
}

// RAII wrappers for the driver objects one benchmark creates.
struct Event {
  const DriverApi& d;
  CUevent e = nullptr;
  explicit Event(const DriverApi& api) : d(api) {}
  ~Event() {
    if (e) d.cuEventDestroy(e);
  }
};
struct DeviceBuffer {
  const DriverApi& d;
  CUdeviceptr p = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(const DriverApi& api) : d(api) {}
  ~DeviceBuffer() {
    if (p) d.cuMemFree(p);
  }
};
struct Graph {
  const DriverApi& d;
  CUgraph g = nullptr;
  CUgraphExec exec = nullptr;
  explicit Graph(const DriverApi& api) : d(api) {}
  ~Graph() {
    if (exec) d.cuGraphExecDestroy(exec);
    if (g) d.cuGraphDestroy(g);
  }
};

Status cu_check(const DriverApi& d, CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return Status::ok();
  return Status::error(Code::kLaunchError, std::string("timing: ") + what + ": " + cu_error(d, r));
}

// Twice the L2 (at least 64 MiB): every line the timed call might hit gets evicted.
void alloc_flush_buffer(const DriverApi& d, DeviceBuffer& buf) {
  CUdevice dev;
  int l2 = 0;
  if (d.cuCtxGetDevice(&dev) == CUDA_SUCCESS) d.cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev);
  size_t bytes = std::max<size_t>(2 * static_cast<size_t>(l2), size_t{64} << 20);
  if (d.cuMemAlloc(&buf.p, bytes) != CUDA_SUCCESS) {
    buf.p = 0;
    log_once(LogLevel::kWarn, "timing-flush", "timing: cannot allocate the L2 flush buffer; timing with a warm L2");
    return;
  }
  buf.bytes = bytes;
}

// Events around `what` on the stream, a device-wide sync (work the callable put on other
// streams counts too), then the elapsed time.
Result<float> timed(const DriverApi& d, CUstream s, Event& start, Event& end, const std::function<Status()>& what) {
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventRecord(start.e, s), "cuEventRecord"));
  KC_RETURN_IF_ERROR(what());
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventRecord(end.e, s), "cuEventRecord"));
  KC_RETURN_IF_ERROR(cu_check(d, d.cuCtxSynchronize(), "cuCtxSynchronize after the timed call"));
  float ms = 0;
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventElapsedTime(&ms, start.e, end.e), "cuEventElapsedTime"));
  return ms;
}

}  // namespace

Timing summarize(std::vector<double> s) {
  Timing t;
  t.reps = static_cast<int>(s.size());
  if (s.empty()) return t;
  std::sort(s.begin(), s.end());
  t.median_ms = percentile(s, 0.5);
  t.p10_ms = percentile(s, 0.1);
  t.p90_ms = percentile(s, 0.9);
  t.min_ms = s.front();
  double sum = 0;
  for (double x : s) sum += x;
  t.mean_ms = sum / static_cast<double>(s.size());
  std::vector<double> dev;
  dev.reserve(s.size());
  for (double x : s) dev.push_back(std::fabs(x - t.median_ms));
  std::sort(dev.begin(), dev.end());
  t.mad_ms = percentile(dev, 0.5);
  return t;
}

Result<Timing> time_cuda(void* stream_ptr, const std::function<Status()>& enqueue, const TimingOptions& o) {
  Result<const DriverApi*> dr = cuda_driver();
  if (!dr.is_ok()) return dr.status();
  const DriverApi& d = *dr.value();
  CUstream stream = static_cast<CUstream>(stream_ptr);
  if (o.graph && !stream)
    return Status::error(Code::kInvalid, "timing: graph mode needs a non-default stream (the legacy stream cannot be captured)");
  CUcontext ctx = nullptr;
  CUresult r = d.cuStreamGetCtx(stream, &ctx);
  if (r != CUDA_SUCCESS || !ctx)
    return Status::error(Code::kUnavailable, "timing: no CUDA context for the stream: " + cu_error(d, r));
  ScopedContext sc(d, ctx);
  KC_RETURN_IF_ERROR(sc.status());

  Event start(d), end(d);
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventCreate(&start.e, CU_EVENT_DEFAULT), "cuEventCreate"));
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventCreate(&end.e, CU_EVENT_DEFAULT), "cuEventCreate"));
  DeviceBuffer flush(d);
  if (o.flush_cache) alloc_flush_buffer(d, flush);
  unsigned char fill = 0;
  auto do_flush = [&]() -> Status {
    if (!flush.p) return Status::ok();
    return cu_check(d, d.cuMemsetD8Async(flush.p, ++fill, flush.bytes, stream), "cuMemsetD8Async (L2 flush)");
  };

  // Warm-up, timed as a whole for the per-call estimate; a faulting kernel stops us here.
  const int warm = std::max(o.warmup, 1);
  Result<float> w = timed(d, stream, start, end, [&]() -> Status {
    for (int i = 0; i < warm; ++i) KC_RETURN_IF_ERROR(enqueue());
    return Status::ok();
  });
  if (!w.is_ok()) return w.status();
  const double per_call = std::max(static_cast<double>(w.value()) / warm, 1e-4);
  double flush_ms = 0;
  if (flush.p) {
    Result<float> f = timed(d, stream, start, end, do_flush);
    if (!f.is_ok()) return f.status();
    flush_ms = f.value();
  }

  Graph graph(d);
  int calls = 1;
  if (o.graph) {
    calls = o.graph_calls > 0 ? o.graph_calls : static_cast<int>(std::clamp(std::ceil(1.0 / per_call), 10.0, 1000.0));
    KC_RETURN_IF_ERROR(cu_check(d, d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture"));
    Status cs;
    for (int i = 0; i < calls && cs.is_ok(); ++i) cs = enqueue();
    // Capture is always ended, so the caller's stream is usable whatever happened.
    r = d.cuStreamEndCapture(stream, &graph.g);
    KC_RETURN_IF_ERROR(cs);
    if (r != CUDA_SUCCESS)
      return Status::error(Code::kLaunchError, "timing: graph capture failed (did the callable synchronize, allocate or "
                                               "use another stream?): " + cu_error(d, r));
    KC_RETURN_IF_ERROR(cu_check(d, d.cuGraphInstantiate(&graph.exec, graph.g, 0), "cuGraphInstantiate"));
    // One untimed replay uploads the graph to the device.
    KC_RETURN_IF_ERROR(cu_check(d, d.cuGraphLaunch(graph.exec, stream), "cuGraphLaunch"));
    KC_RETURN_IF_ERROR(cu_check(d, d.cuCtxSynchronize(), "cuCtxSynchronize after the graph warm-up"));
  }
  auto call = [&]() -> Status {
    if (graph.exec) return cu_check(d, d.cuGraphLaunch(graph.exec, stream), "cuGraphLaunch");
    return enqueue();
  };

  // ~20 us of host-side sync per sample on top of the device work.
  const int reps = reps_for(o, per_call * calls + flush_ms + 0.02);
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(reps));
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    KC_RETURN_IF_ERROR(do_flush());
    Result<float> ms = timed(d, stream, start, end, call);
    if (!ms.is_ok()) return ms.status();
    samples.push_back(static_cast<double>(ms.value()) / calls);
    // The warm-up estimate can be far off (first-call effects): never run past twice the budget.
    if (i + 1 >= o.min_reps && ms_since(t0) > 2 * o.budget_ms) break;
  }
  Timing t = summarize(std::move(samples));
  t.calls_per_rep = calls;
  t.graph = o.graph;
  t.cache_flushed = flush.p != 0;
  return t;
}

namespace {

// Writes twice the last-level cache (32..512 MiB) before each CPU sample.
class CpuFlush {
 public:
  explicit CpuFlush(bool on) {
    if (!on) return;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    buf_.resize(std::clamp<size_t>(2 * static_cast<size_t>(std::max(llc, 0L)), size_t{32} << 20, size_t{512} << 20));
  }
  void operator()() {
    if (buf_.empty()) return;
    std::memset(buf_.data(), ++fill_, buf_.size());
    asm volatile("" : : "r"(buf_.data()) : "memory");  // keep the stores: nothing reads them
  }
  bool on() const { return !buf_.empty(); }

 private:
  std::vector<char> buf_;
  unsigned char fill_ = 0;
};

// The pairs' samples, interleaved, into a PairedTiming; `sample(i, side)` times one call of a
// (side 0) or b (side 1) after a flush and returns milliseconds.
Result<PairedTiming> run_pairs(int reps, double budget_ms, int min_reps,
                               const std::function<Result<double>(int side)>& sample) {
  std::vector<double> sa, sb, ratio;
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    double ms[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const int side = (i % 2 == 0) ? k : 1 - k;
      Result<double> t = sample(side);
      if (!t.is_ok()) return t.status();
      ms[side] = t.value();
    }
    sa.push_back(ms[0]);
    sb.push_back(ms[1]);
    ratio.push_back(ms[1] / std::max(ms[0], 1e-6));
    if (i + 1 >= min_reps && ms_since(t0) > 2 * budget_ms) break;
  }
  PairedTiming p;
  p.pairs = static_cast<int>(ratio.size());
  Timing r = summarize(ratio);
  p.ratio_median = r.median_ms;
  p.ratio_p10 = r.p10_ms;
  p.wins = static_cast<double>(std::count_if(ratio.begin(), ratio.end(), [](double x) { return x > 1.0; })) /
           static_cast<double>(std::max<size_t>(ratio.size(), 1));
  p.a = summarize(std::move(sa));
  p.b = summarize(std::move(sb));
  return p;
}

}  // namespace

Result<PairedTiming> time_paired_cuda(void* stream_ptr, const std::function<Status()>& a,
                                      const std::function<Status()>& b, const TimingOptions& o) {
  Result<const DriverApi*> dr = cuda_driver();
  if (!dr.is_ok()) return dr.status();
  const DriverApi& d = *dr.value();
  CUstream stream = static_cast<CUstream>(stream_ptr);
  CUcontext ctx = nullptr;
  CUresult r = d.cuStreamGetCtx(stream, &ctx);
  if (r != CUDA_SUCCESS || !ctx)
    return Status::error(Code::kUnavailable, "timing: no CUDA context for the stream: " + cu_error(d, r));
  ScopedContext sc(d, ctx);
  KC_RETURN_IF_ERROR(sc.status());
  Event start(d), end(d);
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventCreate(&start.e, CU_EVENT_DEFAULT), "cuEventCreate"));
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventCreate(&end.e, CU_EVENT_DEFAULT), "cuEventCreate"));
  DeviceBuffer flush(d);
  if (o.flush_cache) alloc_flush_buffer(d, flush);
  unsigned char fill = 0;
  auto do_flush = [&]() -> Status {
    if (!flush.p) return Status::ok();
    return cu_check(d, d.cuMemsetD8Async(flush.p, ++fill, flush.bytes, stream), "cuMemsetD8Async (L2 flush)");
  };
  const int warm = std::max(o.warmup, 1);
  Result<float> w = timed(d, stream, start, end, [&]() -> Status {
    for (int i = 0; i < warm; ++i) {
      KC_RETURN_IF_ERROR(a());
      KC_RETURN_IF_ERROR(b());
    }
    return do_flush();
  });
  if (!w.is_ok()) return w.status();
  const int reps = reps_for(o, static_cast<double>(w.value()) / warm + 0.04);
  auto p = run_pairs(reps, o.budget_ms, o.min_reps, [&](int side) -> Result<double> {
    KC_RETURN_IF_ERROR(do_flush());
    Result<float> ms = timed(d, stream, start, end, side == 0 ? a : b);
    if (!ms.is_ok()) return ms.status();
    return static_cast<double>(ms.value());
  });
  if (p) p->a.cache_flushed = p->b.cache_flushed = flush.p != 0;
  return p;
}

Result<double> time_once_cuda(void* stream_ptr, const std::function<Status()>& enqueue) {
  Result<const DriverApi*> dr = cuda_driver();
  if (!dr.is_ok()) return dr.status();
  const DriverApi& d = *dr.value();
  CUstream stream = static_cast<CUstream>(stream_ptr);
  CUcontext ctx = nullptr;
  CUresult r = d.cuStreamGetCtx(stream, &ctx);
  if (r != CUDA_SUCCESS || !ctx) return Status::error(Code::kUnavailable, "timing: no CUDA context for the stream");
  ScopedContext sc(d, ctx);
  KC_RETURN_IF_ERROR(sc.status());
  Event start(d), end(d);
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventCreate(&start.e, CU_EVENT_DEFAULT), "cuEventCreate"));
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventCreate(&end.e, CU_EVENT_DEFAULT), "cuEventCreate"));
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventRecord(start.e, stream), "cuEventRecord"));
  KC_RETURN_IF_ERROR(enqueue());
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventRecord(end.e, stream), "cuEventRecord"));
  // Only this stream's work is waited for: other streams of the user's program keep running.
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventSynchronize(end.e), "cuEventSynchronize"));
  float ms = 0;
  KC_RETURN_IF_ERROR(cu_check(d, d.cuEventElapsedTime(&ms, start.e, end.e), "cuEventElapsedTime"));
  return static_cast<double>(ms);
}

Result<double> time_once_cpu(const std::function<Status()>& fn) {
  auto t = Clock::now();
  KC_RETURN_IF_ERROR(fn());
  return ms_since(t);
}

Result<Timing> time_cpu(const std::function<Status()>& fn, const TimingOptions& o) {
  if (o.graph) return Status::error(Code::kInvalid, "timing: graph mode is CUDA only");
  CpuFlush do_flush(o.flush_cache);
  const int warm = std::max(o.warmup, 1);
  auto tw = Clock::now();
  for (int i = 0; i < warm; ++i) KC_RETURN_IF_ERROR(fn());
  const double per_call = ms_since(tw) / warm;
  auto tf = Clock::now();
  do_flush();
  const double flush_ms = ms_since(tf);

  const int reps = reps_for(o, per_call + flush_ms);
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(reps));
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    do_flush();
    auto a = Clock::now();
    KC_RETURN_IF_ERROR(fn());
    samples.push_back(ms_since(a));
    if (i + 1 >= o.min_reps && ms_since(t0) > 2 * o.budget_ms) break;
  }
  Timing t = summarize(std::move(samples));
  t.cache_flushed = do_flush.on();
  return t;
}

Result<PairedTiming> time_paired_cpu(const std::function<Status()>& a, const std::function<Status()>& b,
                                     const TimingOptions& o) {
  CpuFlush do_flush(o.flush_cache);
  const int warm = std::max(o.warmup, 1);
  auto tw = Clock::now();
  for (int i = 0; i < warm; ++i) {
    KC_RETURN_IF_ERROR(a());
    KC_RETURN_IF_ERROR(b());
  }
  const double per_pair = ms_since(tw) / warm;
  auto tf = Clock::now();
  do_flush();
  const int reps = reps_for(o, per_pair + 2 * ms_since(tf));
  auto r = run_pairs(reps, o.budget_ms, o.min_reps, [&](int side) -> Result<double> {
    do_flush();
    auto t = Clock::now();
    KC_RETURN_IF_ERROR(side == 0 ? a() : b());
    return ms_since(t);
  });
  if (r) r->a.cache_flushed = r->b.cache_flushed = do_flush.on();
  return r;
}

}  // namespace kc
