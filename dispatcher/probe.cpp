// The serve probe's bookkeeping and decision (probe.h); the timed calls are in call.cpp.
#include "dispatcher/probe.h"

#include <algorithm>
#include <vector>

namespace kc::dispatch {

void arm_probe(ServeProbe& p, int calls) {
  std::lock_guard<std::mutex> g(p.mu);
  p.served_ms.clear();
  p.eager_ms.clear();
  p.left.store(calls > 0 ? calls + 1 : 0, std::memory_order_relaxed);
}

ProbeVerdict judge_probe(const std::vector<double>& served_ms, const std::vector<double>& eager_ms) {
  ProbeVerdict v;
  v.done = true;
  std::vector<double> ratio;
  // Sample 0 is the warm-up pair (module load, first allocation, cold caches): not counted.
  for (size_t i = 1; i < served_ms.size() && i < eager_ms.size(); ++i)
    ratio.push_back(eager_ms[i] / std::max(served_ms[i], 1e-9));
  v.pairs = ratio.size();
  if (ratio.empty()) return v;   // nothing to judge on: keep what the gauntlet promoted
  std::sort(ratio.begin(), ratio.end());
  const size_t n = ratio.size();
  v.speedup = n % 2 ? ratio[n / 2] : 0.5 * (ratio[n / 2 - 1] + ratio[n / 2]);
  v.keep = v.speedup > 1.0;
  return v;
}

ProbeVerdict add_probe_pair(ServeProbe& p, double served_ms, double eager_ms) {
  std::lock_guard<std::mutex> g(p.mu);
  if (p.left.load(std::memory_order_relaxed) <= 0) return {};   // another thread made the last pair
  p.served_ms.push_back(served_ms);
  p.eager_ms.push_back(eager_ms);
  if (p.left.fetch_sub(1, std::memory_order_relaxed) != 1) return {};
  return judge_probe(p.served_ms, p.eager_ms);
}

}  // namespace kc::dispatch
