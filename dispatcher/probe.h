// The serve probe: the first calls of a kernel newly served in this process also run eager, both
// timed where they run (CUDA events on the caller's stream, or the CPU clock), in alternating
// order. The caller gets eager's result for those calls. A kernel that is not faster than eager
// in either order is demoted to eager for the rest of the process and reported: the worker's
// timing was taken elsewhere (another process, other load), and "never slower than eager" is
// judged here.
#pragma once
#include <cstddef>
#include <vector>

#include "kernel_cache/kernel_table.h"

namespace kc::dispatch {

struct ProbeVerdict {
  bool done = false;       // this pair was the last one: the decision below holds
  bool keep = true;        // keep serving (false: demote)
  double speedup = 0;      // eager / served: the geometric mean of the two orders' medians
  size_t pairs = 0;        // pairs counted (the first, which pays first-call costs, is not)
};

// Arms a newly loaded kernel's probe for `calls` pairs (plus one uncounted warm-up pair); 0: off.
void arm_probe(ServeProbe& p, int calls);
// Adds one timed pair. Thread-safe; exactly one caller sees done == true.
ProbeVerdict add_probe_pair(ServeProbe& p, const ProbeSample& pair);
// The decision on complete samples (samples[0], the warm-up, is not counted): keep only if, in each
// order that was timed, the median of eager / served is above 1. Whoever runs second finds the
// inputs in cache, which for inputs that fit in L2 can be worth more than a small real gain, so
// the kernel must win also when it runs first, on cold inputs. Ties and losses are demoted: a
// kernel that is merely as fast is not worth the risk.
ProbeVerdict judge_probe(const std::vector<ProbeSample>& samples);

}  // namespace kc::dispatch
