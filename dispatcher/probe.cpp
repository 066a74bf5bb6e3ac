// The serve probe's bookkeeping and decision (probe.h); the timed calls are in call.cpp.
#include "dispatcher/probe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/timing.h"

namespace kc::dispatch {

void arm_probe(ServeProbe& p, int calls) {
  std::lock_guard<std::mutex> g(p.mu);
  p.samples.clear();
  p.left.store(calls > 0 ? calls + 1 : 0, std::memory_order_relaxed);
}

ProbeVerdict judge_probe(const std::vector<ProbeSample>& samples) {
  ProbeVerdict v;
  v.done = true;
  std::vector<double> ratio[2];   // eager / served, by order: [0] eager ran first, [1] served first
  // Pair 0 is the warm-up (module load, first allocation, cold caches): not counted.
  for (size_t i = 1; i < samples.size(); ++i)
    ratio[samples[i].served_first].push_back(samples[i].eager_ms / std::max(samples[i].served_ms, 1e-9));
  v.pairs = ratio[0].size() + ratio[1].size();
  if (v.pairs == 0) return v;   // nothing to judge on: keep what the gauntlet promoted
  double log_sum = 0;
  int orders = 0;
  for (const auto& r : ratio) {
    if (r.empty()) continue;
    const double m = summarize(r).median_ms;   // the project's one median (of ratios here)
    v.keep = v.keep && m > 1.0;
    log_sum += std::log(std::max(m, 1e-12));
    ++orders;
  }
  v.speedup = std::exp(log_sum / orders);
  return v;
}

ProbeVerdict add_probe_pair(ServeProbe& p, const ProbeSample& pair) {
  std::lock_guard<std::mutex> g(p.mu);
  if (p.left.load(std::memory_order_relaxed) <= 0) return {};   // another thread made the last pair
  p.samples.push_back(pair);
  if (p.left.fetch_sub(1, std::memory_order_relaxed) != 1) return {};
  return judge_probe(p.samples);
}

}  // namespace kc::dispatch
