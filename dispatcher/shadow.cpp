// The live check's sampling, comparison, evidence and background cache writes; see shadow.h. The
// calls themselves are made in call.cpp.
#include "dispatcher/shadow.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>

#include "dispatcher/call.h"
#include "kernel_cache/disable.h"
#include "kernel_cache/key.h"
#include "kernel_cache/live_compare.h"
#include "runtime/cuda_backend.h"
#include "runtime/fork.h"
#include "runtime/log.h"

namespace kc::dispatch {

bool shadow_due(uint64_t n, uint64_t salt, int first, int every) {
  if (n < static_cast<uint64_t>(first > 0 ? first : 0)) return true;
  if (every <= 0) return false;
  if (every == 1) return true;
  // splitmix64 of (n, salt): one in `every` on average, at no fixed stride.
  uint64_t z = n + salt * 0x9E3779B97F4A7C15ull + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z % static_cast<uint64_t>(every) == 0;
}

nlohmann::json ShadowVerdict::to_json() const {
  return {{"match", match}, {"output", "out" + std::to_string(output)}, {"check", check}, {"index", index},
          {"error", std::isfinite(error) ? nlohmann::json(error) : nlohmann::json("inf")},
          {"budget", budget}, {"expected", std::isfinite(expected) ? nlohmann::json(expected) : nlohmann::json(std::to_string(expected))},
          {"actual", std::isfinite(actual) ? nlohmann::json(actual) : nlohmann::json(std::to_string(actual))}};
}

namespace {

// error_bound for contiguous fp32 on the CPU, where each at:: op above is a pass over memory: two
// fused passes (the mean magnitude, then the largest error) and no temporaries, about a quarter of
// the memory traffic. Infinity when anything is not finite.
double cpu_bound_f32(const at::Tensor& x, const at::Tensor& r) {
  const float* px = x.data_ptr<float>();
  const float* pr = r.data_ptr<float>();
  const int64_t n = r.numel(), grain = 1 << 15, chunks = (n + grain - 1) / grain;
  std::vector<double> part(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      double s = 0;
      for (int64_t i = c * grain, end = std::min(n, i + grain); i < end; ++i) s += std::fabs(pr[i]);
      part[c] = s;
    }
  });
  double sum = 0;
  for (double v : part) sum += v;
  const double tau = std::max(0.1 * sum / static_cast<double>(n), static_cast<double>(std::numeric_limits<float>::min()));
  if (!std::isfinite(tau)) return std::numeric_limits<double>::infinity();
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      float m = 0;
      bool nan = false;
      for (int64_t i = c * grain, end = std::min(n, i + grain); i < end; ++i) {
        const float v = std::fabs(px[i] - pr[i]) / (std::fabs(pr[i]) + static_cast<float>(tau));
        nan |= v != v;
        m = v > m ? v : m;
      }
      part[c] = nan ? std::numeric_limits<double>::infinity() : m;
    }
  });
  return *std::max_element(part.begin(), part.end());
}

std::atomic<uint64_t> g_fused{0};   // outputs bounded by the CUDA comparison kernel

// The same bound on a CUDA device with the comparison kernel of kernel_cache/live_compare.h: three
// launches and one 32-byte copy. One module per (device, dtype, size), since a resolved spec fixes
// its arguments; a key's outputs keep their sizes, so that is a load or two per key and process.
class FusedBound {
 public:
  static FusedBound& get() {
    static constinit PerFork<FusedBound> f;   // never destroyed: modules stay loaded to the end
    return f.get();
  }

  // nullopt: not available here (no kernel in the cache, a dtype or layout it does not take, a
  // failed load or launch); the caller bounds with ATen ops instead.
  std::optional<double> bound(const at::Tensor& x, const at::Tensor& r, const std::string& dir, const std::string& target) {
    const char* suffix = dtype_suffix(r.scalar_type());
    if (!suffix || !cuda_hooks().stream || dir.empty() || !x.is_contiguous() || !r.is_contiguous()) return std::nullopt;
    const int device = r.device().index();
    Launcher* l = launcher(device, r.numel(), suffix, dir, target);
    if (!l) return std::nullopt;
    const at::Tensor acc = at::empty({4}, r.options().dtype(at::kDouble));
    void* ptrs[3] = {acc.data_ptr(), const_cast<void*>(x.data_ptr()), const_cast<void*>(r.data_ptr())};
    ExecContext ctx;
    ctx.stream = cuda_hooks().stream(device);
    if (Status s = l->run(ptrs, ctx); !s) {
      log_once(LogLevel::kWarn, "live-compare-run", "live check: the comparison kernel failed (" + s.to_string() +
                                                        "); comparing with ATen ops");
      return std::nullopt;
    }
    const at::Tensor h = acc.cpu();
    const double* p = h.data_ptr<double>();
    g_fused.fetch_add(1, std::memory_order_relaxed);
    return p[1] > 0 ? std::numeric_limits<double>::infinity() : p[2];
  }

 private:
  static const char* dtype_suffix(at::ScalarType t) {
    switch (t) {
      case at::kFloat: return "f32";
      case at::kDouble: return "f64";
      case at::kHalf: return "f16";
      case at::kBFloat16: return "bf16";
      default: return nullptr;
    }
  }

  Launcher* launcher(int device, int64_t n, const char* suffix, const std::string& dir, const std::string& target) {
    std::lock_guard<std::mutex> g(mu_);
    const std::string id = std::to_string(device) + "/" + suffix + "/" + std::to_string(n);
    if (auto it = launchers_.find(id); it != launchers_.end()) return it->second.get();
    if (launchers_.size() >= kMaxModules) return nullptr;
    auto cubin = cubins_.find(target);
    if (cubin == cubins_.end()) {   // read once per process: a later build is for later processes
      auto b = read_live_compare(dir, target);
      cubin = cubins_.emplace(target, b ? std::move(b.value()) : std::string()).first;
    }
    if (cubin->second.empty()) return nullptr;
    auto be = cuda_backend(device);
    if (!be) return nullptr;
    const int64_t blocks = std::clamp<int64_t>((n + 1023) / 1024, 1, 2048);
    auto param_ptr = [](int slot) { Param p{Param::Kind::kPtr}; p.slot = slot; return p; };
    Param len{Param::Kind::kI64};
    len.imm.i64 = n;
    ResolvedSpec spec;
    spec.num_tensor_slots = 3;   // acc, x, r
    spec.launches = {{"kc_live_zero", {1, 1, 1}, {32, 1, 1}, 0, {param_ptr(0)}},
                     {std::string("kc_live_sum_") + suffix, {blocks, 1, 1}, {256, 1, 1}, 0, {param_ptr(0), param_ptr(2), len}},
                     {std::string("kc_live_err_") + suffix, {blocks, 1, 1}, {256, 1, 1}, 0,
                      {param_ptr(0), param_ptr(1), param_ptr(2), len}}};
    auto l = be.value()->load(cubin->second, spec);
    if (!l) {
      log_once(LogLevel::kWarn, "live-compare-load:" + target, "live check: cannot load the comparison kernel (" +
                                                                   l.status().to_string() + "); comparing with ATen ops");
      cubin->second.clear();
      return nullptr;
    }
    return launchers_.emplace(id, std::move(l.value())).first->second.get();
  }

  static constexpr size_t kMaxModules = 256;
  std::mutex mu_;
  std::map<std::string, std::string> cubins_;                       // by target; "" when absent
  std::map<std::string, std::unique_ptr<Launcher>> launchers_;      // by device/dtype/size
};

// The common case, cheaply: an upper bound of the largest mixed error, with tau from the mean
// magnitude instead of the rms (never larger, so the error is never smaller), in a handful of passes
// and one sync. NaN or infinity anywhere, or a non-finite mean, gives a bound that is not finite.
double error_bound(const at::Tensor& x, const at::Tensor& r, const std::string& dir, const std::string& target) {
  if (r.is_cpu() && x.is_cpu() && r.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat &&
      r.is_contiguous() && x.is_contiguous())
    return cpu_bound_f32(x, r);
  if (r.is_cuda() && x.is_cuda())
    if (auto b = FusedBound::get().bound(x, r, dir, target)) return *b;
  const at::ScalarType ct = r.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(ct), rf = r.to(ct);
  at::Tensor ra = rf.abs();
  const at::Tensor tau = (0.1 * ra.mean()).clamp_min(std::numeric_limits<float>::min());
  at::Tensor d = xf.sub(rf);
  d.abs_();
  ra.add_(tau);
  d.div_(ra);
  const at::Tensor two = at::stack({d.max().to(at::kDouble), tau.to(at::kDouble)}).cpu();
  const double* p = two.data_ptr<double>();
  return std::isfinite(p[1]) ? p[0] : std::numeric_limits<double>::infinity();
}

// One floating-point output, exactly: the largest mixed error, where it is, and the two values there.
void measure(const at::Tensor& x, const at::Tensor& r, ShadowVerdict& v) {
  const at::ScalarType ct = r.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xf = x.to(ct).reshape(-1), rf = r.to(ct).reshape(-1);
  const at::Tensor fin = at::isfinite(rf) & at::isfinite(xf);
  const at::Tensor rz = at::where(fin, rf, at::zeros_like(rf));
  // rms scaled by the largest magnitude: squares of fp32 values past 1e19 would overflow.
  const at::Tensor amax = rz.abs().max();
  const at::Tensor scale = at::where(amax > 0, amax, at::ones_like(amax));
  const at::Tensor rms = scale * (rz / scale).square().mean().sqrt();
  const at::Tensor tau = (0.1 * rms).clamp_min(std::numeric_limits<float>::min());
  const at::Tensor rel = (xf - rf).abs() / (rf.abs() + tau);
  const at::Tensor same = (xf == rf) | (at::isnan(xf) & at::isnan(rf));   // equal infinities, or both NaN
  const at::Tensor inf = at::full({}, std::numeric_limits<double>::infinity(), rel.options());
  const at::Tensor e = at::where(fin, rel, at::where(same, at::zeros_like(rel), inf));
  auto [val, idx] = e.max(0);
  // One transfer for the four numbers.
  const at::Tensor four = at::stack({val.to(at::kDouble), idx.to(at::kDouble), rf.index({idx}).to(at::kDouble),
                                     xf.index({idx}).to(at::kDouble)}).cpu();
  const double* p = four.data_ptr<double>();
  v.error = p[0];
  v.index = static_cast<int64_t>(p[1]);
  v.expected = p[2];
  v.actual = p[3];
}

}  // namespace

uint64_t fused_comparisons() { return g_fused.load(std::memory_order_relaxed); }

ShadowVerdict compare_outputs(const std::vector<at::Tensor>& served, const std::vector<at::Tensor>& eager,
                              const Record& record, const std::string& cache_dir) {
  ShadowVerdict v;
  auto fail = [&](int j, const char* check) {
    v.match = false;
    v.output = j;
    v.check = check;
    return v;
  };
  if (served.size() != eager.size()) return fail(0, "presence");
  for (size_t j = 0; j < served.size(); ++j) {
    const at::Tensor &x = served[j], &r = eager[j];
    const int jj = static_cast<int>(j);
    if (x.defined() != r.defined()) return fail(jj, "presence");
    if (!r.defined() || r.numel() == 0) continue;
    if (x.scalar_type() != r.scalar_type() || x.sizes() != r.sizes()) return fail(jj, "layout");
    if (!r.is_floating_point()) {
      if (!at::equal(x, r)) return fail(jj, "exact");
      continue;
    }
    const double budget = live_budget(record, j, to_dtype(r.scalar_type()));
    if (error_bound(x, r, cache_dir, key_target(record.key)) <= budget) continue;   // NaN and infinity fail this, and are looked at below
    ShadowVerdict o;
    measure(x, r, o);
    o.budget = budget;
    if (!(o.error <= o.budget)) {
      o.match = false;
      o.output = jj;
      o.check = "error budget";
      return o;
    }
  }
  return v;
}

nlohmann::json summarize_inputs(const std::vector<std::string>& names, const std::vector<const at::Tensor*>& inputs) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t k = 0; k < inputs.size() && k < names.size(); ++k) {
    const at::Tensor& t = *inputs[k];
    if (!t.defined()) {
      out[names[k]] = nullptr;
      continue;
    }
    nlohmann::json s = {{"dtype", dtype_name(to_dtype(t.scalar_type()))}, {"sizes", t.sizes().vec()}};
    if (t.is_floating_point() && t.numel() > 0) {
      const at::Tensor d = t.to(at::kDouble);
      const at::Tensor fin = at::isfinite(d);
      const at::Tensor z = at::where(fin, d, at::zeros_like(d));
      const double nonfinite = (~fin).sum().item<double>();
      const bool any = nonfinite < static_cast<double>(t.numel());
      s["min"] = any ? at::where(fin, d, at::full_like(d, INFINITY)).min().item<double>() : 0.0;
      s["max"] = any ? at::where(fin, d, at::full_like(d, -INFINITY)).max().item<double>() : 0.0;
      s["abs_max"] = z.abs().max().item<double>();
      s["rms"] = std::sqrt(z.square().mean().item<double>());
      s["nonfinite"] = static_cast<int64_t>(nonfinite);
    }
    out[names[k]] = std::move(s);
  }
  return out;
}

namespace {

// The background writer: one per process (runtime/fork.h), started on the first disable.
class Disabler {
 public:
  static Disabler& get() {
    static constinit PerFork<Disabler> d;   // never destroyed: used until the process ends
    return d.get();
  }

  void push(std::string dir, std::shared_ptr<const Record> r, nlohmann::json evidence) {
    std::lock_guard<std::mutex> g(mu_);
    if (!started_) {
      try {
        std::thread([this] { loop(); }).detach();
        started_ = true;
      } catch (const std::exception& e) {   // no threads left: the key stays disabled here only
        last_error_ = std::string("cannot start the writer thread: ") + e.what();
        ++failed_;
        return;
      }
    }
    queue_.push_back({std::move(dir), std::move(r), std::move(evidence)});
    cv_.notify_all();
  }

  bool flush(double timeout_s) {
    std::unique_lock<std::mutex> g(mu_);
    return cv_.wait_for(g, std::chrono::duration<double>(timeout_s), [&] { return queue_.empty() && !busy_; });
  }

  nlohmann::json status() {
    std::lock_guard<std::mutex> g(mu_);
    return {{"queued", queue_.size() + (busy_ ? 1 : 0)}, {"written", written_}, {"failed", failed_},
            {"last_error", last_error_}};
  }

 private:
  struct Item {
    std::string dir;
    std::shared_ptr<const Record> record;
    nlohmann::json evidence;
  };

  void loop() {
    for (;;) {
      Item it;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return !queue_.empty(); });
        it = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      Status s = Status::error(Code::kIOError, "not written");
      try {   // an exception escaping a thread would terminate the user's process
        s = disable_stored(it.dir, *it.record, it.evidence);
      } catch (const std::exception& e) {
        s = Status::error(Code::kIOError, e.what());
      }
      if (s) log(LogLevel::kInfo, "live check: disabled " + it.record->key + " in the cache at " + it.dir);
      else
        log(LogLevel::kWarn, "live check: could not disable " + it.record->key + " in the cache at " + it.dir + " (" +
                                 s.to_string() + "); it stays disabled in this process");
      std::lock_guard<std::mutex> g(mu_);
      busy_ = false;
      if (s) ++written_;
      else {
        ++failed_;
        last_error_ = s.to_string();
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool started_ = false, busy_ = false;
  uint64_t written_ = 0, failed_ = 0;
  std::string last_error_;
};

}  // namespace

void disable_in_cache(const std::string& dir, std::shared_ptr<const Record> checked, nlohmann::json evidence) {
  Disabler::get().push(dir, std::move(checked), std::move(evidence));
}

bool flush_disables(double timeout_s) { return Disabler::get().flush(timeout_s); }

nlohmann::json disable_status() { return Disabler::get().status(); }

}  // namespace kc::dispatch
