// The reduction family's reference for the template tests (CPU: template_cpu_reference_reduction.cpp,
// GPU: tests/gpu/template_gpu_reference.cpp): each output folds its r inputs (the [outer, r, inner]
// or [r1, mid, r2] view of reduce_geometry) in double, straight from the definition. Max / min values and argmax /
// argmin / max.dim / min.dim indices are exact (first index on ties, the first NaN wins); a sum's
// scale is its magnitude, the variance's that of its deviations (the mean's error cancels to first
// order), a product's its own magnitude grown by sqrt(r) fp32 roundings (relative errors compound).
// Logsumexp: m + log(sum exp(x - m)) (NaN with a NaN, +inf with a +inf, -inf with only -inf);
// its scale is |y| plus the sum's sqrt(r) and log(r) and each term's subtraction error, weighted
// by the term's share of the sum.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "evolve/ops/reduction.h"

namespace kc::evolve::red_ref {

// One output's reference and error scale; out1 / out1_scale: output 1 (var_mean / std_mean's
// mean, max / min.dim's index).
struct Out {
  double ref = 0, scale = 0, out1 = 0, out1_scale = 0;
};

// The flat index of input l (0 <= l < r, in order) of output o.
inline int64_t elem(const ReduceGeom& g, int64_t o, int64_t l) {
  if (!g.block) return (l / g.r2) * g.mid * g.r2 + o * g.r2 + l % g.r2;
  return (o / g.inner) * g.r * g.inner + o % g.inner + l * g.inner;
}

template <class X> Out logsumexp(const ReduceGeom& g, const X& x, int64_t o) {
  double m = -INFINITY;
  bool nan = false;
  for (int64_t l = 0; l < g.r; ++l) {
    const double v = x[elem(g, o, l)];
    nan = nan || std::isnan(v);
    m = std::max(m, v);
  }
  Out r;
  if (nan || std::isinf(m)) {
    r.ref = nan ? NAN : m;
    return r;
  }
  double s = 0, wd = 0;
  for (int64_t l = 0; l < g.r; ++l) s += std::exp(static_cast<double>(x[elem(g, o, l)]) - m);
  r.ref = m + std::log(s);
  for (int64_t l = 0; l < g.r; ++l) {
    const double v = x[elem(g, o, l)];
    if (v > -INFINITY) wd += std::exp(v - r.ref) * (m - v);   // a -inf term weighs nothing
  }
  const double n = static_cast<double>(g.r);
  r.scale = std::fabs(r.ref) + std::log(n) + std::sqrt(n) + 4 + 3 * wd;
  return r;
}

// Output o of `g` from x (any container of values indexable by int64).
template <class X> Out fold(const ReduceGeom& g, const X& x, int64_t o, double unit) {
  if (g.kind == ReduceKind::kLogSumExp) return logsumexp(g, x, o);
  const bool want_max = selects_max(g.kind) || (g.kind == ReduceKind::kNorm && g.ord == NormOrd::kInf);
  double sum = 0, abs = 0, pw = 0, best = 0, prod = 1;
  int64_t at = -1;
  for (int64_t l = 0; l < g.r; ++l) {
    double v = x[elem(g, o, l)];
    sum += v;
    prod *= v;
    abs += std::fabs(v);
    if (g.kind == ReduceKind::kNorm) {
      v = std::fabs(v);
      if (g.ord == NormOrd::kP) pw += std::pow(v, g.p);
    }
    if (at < 0 || (!std::isnan(best) && (std::isnan(v) || (want_max ? v > best : v < best)))) best = v, at = l;
  }
  const double n = static_cast<double>(g.r), mean = sum / n;
  Out r;
  // Welford's mean (var_mean / std_mean) turns NaN once it meets an infinity, wherever it sits.
  r.out1 = welford(g.kind) && !std::isfinite(sum) ? NAN : mean;
  r.out1_scale = abs / n + std::fabs(mean);
  switch (g.kind) {
    case ReduceKind::kSum: r.ref = sum, r.scale = abs + std::fabs(sum); return r;
    case ReduceKind::kMean: r.ref = mean, r.scale = r.out1_scale; return r;
    case ReduceKind::kProd: r.ref = prod, r.scale = std::fabs(prod) * (1 + std::sqrt(n) * 1.19e-7 / unit); return r;
    case ReduceKind::kMaxDim:
    case ReduceKind::kMinDim: r.ref = best, r.out1 = static_cast<double>(at), r.out1_scale = 0; return r;
    case ReduceKind::kMax:
    case ReduceKind::kMin: r.ref = best; return r;
    case ReduceKind::kArgMax:
    case ReduceKind::kArgMin: r.ref = static_cast<double>(at); return r;
    case ReduceKind::kNorm:
      if (g.ord != NormOrd::kP) r.ref = best;
      else r.ref = std::pow(pw, 1.0 / g.p), r.scale = 4 * std::fabs(r.ref);
      return r;
    default: break;
  }
  double dev2 = 0, devx = 0;
  for (int64_t l = 0; l < g.r; ++l) {
    const double v = x[elem(g, o, l)], d = v - mean;
    dev2 += d * d;
    devx += std::fabs(d) * std::fabs(v);
  }
  const double div = std::max(n - g.correction, 0.0);
  const double var = dev2 / div;
  // The fold's own mean errs by about unit * out1_scale and shifts every deviation by that: var
  // gains n times its square over div, second order, but std near 0 gains its square root, first
  // order (on a constant row an fp32 fold's std is a few ulp of the value, not 0).
  const double hv = (dev2 + 2 * devx + n * unit * r.out1_scale * r.out1_scale) / std::max(div, 1.0);
  const bool sd = g.kind == ReduceKind::kStd || g.kind == ReduceKind::kStdMean;
  r.ref = sd ? std::sqrt(var) : var;
  // Std: half var's relative error, and at most the square root of its absolute error near 0
  // (fmin: on a constant row the first is 0 / 0).
  r.scale = sd ? std::fmin(hv / (2 * r.ref), std::sqrt(hv / unit)) + r.ref : hv + var;
  return r;
}

}  // namespace kc::evolve::red_ref
