// Stage timing: candidate and eager on the same inputs, L2 flushed, events, medians
// (runtime/timing.h). In full mode interleaved, pair by pair, so both see the same machine.
#include <algorithm>
#include <exception>

#include "evolve/verify/gauntlet_run.h"

namespace kc::evolve {
namespace {

void record(Verdict& v, StageReport& s, const Timing& t, const Timing& eager) {
  v.median_ms = t.median_ms;
  v.mad_ms = t.mad_ms;
  v.eager_median_ms = eager.median_ms;
  v.eager_mad_ms = eager.mad_ms;
  s.evidence = {{"median_ms", v.median_ms}, {"mad_ms", v.mad_ms}, {"p10_ms", t.p10_ms},
                {"p90_ms", t.p90_ms}, {"reps", t.reps}, {"eager_median_ms", v.eager_median_ms},
                {"eager_mad_ms", v.eager_mad_ms}, {"l2_flushed", t.cache_flushed}};
  if (v.pairs > 0)
    s.evidence["paired"] = {{"pairs", v.pairs}, {"speedup_median", v.speedup_median}, {"speedup_p10", v.speedup_p10},
                            {"wins", v.wins}};
  s.summary = std::to_string(v.median_ms * 1e3) + " us vs eager " + std::to_string(v.eager_median_ms * 1e3) + " us" +
              (v.pairs > 0 ? " (interleaved, " + std::to_string(v.pairs) + " pairs)" : "");
}

// The device's copy bandwidth (bytes read plus bytes written over the median time of one copy),
// timed with the candidate's clock and cache flushes: the peak a report puts achieved bandwidth
// against. Past the H200's 60 MiB L2 on CUDA; 32 MiB on the CPU, whose flush evicts it too.
// 0 when the copy cannot be timed (the promotion does not depend on it).
double copy_gb_s(Gauntlet::Impl& m, const TimingOptions& to) {
  const int64_t bytes = m.cuda() ? (int64_t{256} << 20) : (int64_t{32} << 20);
  try {
    const auto opts = at::TensorOptions().dtype(at::kByte).device(m.dev);
    at::Tensor src = at::ones({bytes}, opts), dst = at::empty({bytes}, opts);
    auto fn = [&]() -> Status {
      dst.copy_(src);
      return Status::ok();
    };
    TimingOptions o = to;
    o.budget_ms = std::min(o.budget_ms, 50.0);
    Result<Timing> t = m.cuda() ? time_cuda(nullptr, fn, o) : time_cpu(fn, o);
    return t && t.value().median_ms > 0 ? 2.0 * static_cast<double>(bytes) / (t.value().median_ms * 1e-3) / 1e9 : 0;
  } catch (const std::exception&) {
    return 0;   // out of memory beside the key's inputs: no peak for this record
  }
}

class TimingStage final : public GauntletStage {
 public:
  StageId id() const override { return StageId::kTiming; }
  bool runs_in(Mode mode) const override { return mode != Mode::kSanitize; }
  bool run(Gauntlet::Run& r) const override {
    if (!r.acquire_normal(id())) return false;
    auto t0 = Clock::now();
    StageReport& s = r.stage(id());
    Gauntlet::Impl& m = r.m;
    Verdict& v = r.v;
    TimingOptions to;
    to.budget_ms = m.opt.timing_budget_ms;
    auto fn = [&]() -> Status {
      std::vector<at::Tensor> outs = m.alloc_outputs();   // as the serving path does, per call
      std::vector<at::Tensor> scratch = m.alloc_scratch(r.spec);
      return m.launch(*r.launcher, r.spec, r.normal->inputs, outs, scratch);
    };
    Result<Timing> t = Status::error(Code::kInvalid, "not timed");
    Result<Timing> eager = t;
    if (r.mode == Mode::kFull) {   // promotion: both sides in one window, pair by pair
      auto eager_fn = [&]() -> Status { return m.eager_call(r.normal->inputs); };
      to.budget_ms *= 2;
      auto p = m.cuda() ? time_paired_cuda(nullptr, fn, eager_fn, to) : time_paired_cpu(fn, eager_fn, to);
      if (p) {
        t = p.value().a;
        eager = p.value().b;
        v.pairs = p.value().pairs;
        v.speedup_median = p.value().ratio_median;
        v.speedup_p10 = p.value().ratio_p10;
        v.wins = p.value().wins;
      } else {
        t = p.status();
      }
    } else {
      eager = r.g.eager_timing();
      if (!eager) return r.reject(s, "eager timing failed: " + eager.status().message());
      t = m.cuda() ? time_cuda(nullptr, fn, to) : time_cpu(fn, to);
    }
    s.millis = ms_since(t0);
    if (!t) {
      m.sync().ignore();
      return r.reject(s, "timing failed: " + t.status().message());
    }
    record(v, s, t.value(), eager.value());
    if (r.mode == Mode::kFull) {   // once per promotion, in the window its timing came from
      v.copy_gb_s = copy_gb_s(m, to);
      s.evidence["copy_gb_s"] = v.copy_gb_s;
    }
    return true;
  }
};

}  // namespace

const GauntletStage& timing_stage() {
  static const TimingStage s;
  return s;
}

}  // namespace kc::evolve
