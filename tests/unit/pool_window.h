// The pooling window of an output along one axis, for the pooling backward references of the
// CPU and GPU template tests, straight from the definition (independent of evolve/'s kernels).
#pragma once
#include <algorithm>
#include <cstdint>

#include "evolve/ops/pool.h"

namespace kc::evolve::pool_ref {

// Window o along axis a clipped to the input, [lo, hi), and its length before clipping (the
// count_include_pad divisor; adaptive windows are never padded).
struct Win {
  int64_t lo, hi, padded;
};
inline Win window(const PoolGeom& g, int a, int64_t o) {
  if (g.adaptive) {
    const int64_t lo = o * g.in[a] / g.out[a], hi = ((o + 1) * g.in[a] + g.out[a] - 1) / g.out[a];
    return {lo, hi, hi - lo};
  }
  const int64_t lo = o * g.s[a] - g.p[a], hi = std::min(lo + g.k[a], g.in[a] + g.p[a]);
  return {std::max<int64_t>(lo, 0), std::min(hi, g.in[a]), hi - lo};
}

}  // namespace kc::evolve::pool_ref
