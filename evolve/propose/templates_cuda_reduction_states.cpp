// The fold state of each reduction kind for the CUDA reduction template (declared in
// templates_cuda_reduction.h). Every kernel of templates_cuda_reduction.cpp folds through one:
// kc_init, kc_add (one element and its index along r), kc_merge, kc_shfl and kc_store.
#include <cstdio>

#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_reduction.h"

namespace kc::evolve::cuda_tpl {
namespace {

// A float literal of v in device code ("3f" is not one).
std::string flit(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "((float)%.17g)", v);
  return b;
}

// argmax, argmin, max.dim, min.dim: the best value and its index along the reduced extent, held
// in 32 bits where that extent allows (half the shuffles and shared memory of the column merge,
// cheaper compares), stored as int64.
std::string indexed_state(ReduceKind k, int64_t r) {
  const bool narrow = r <= INT_MAX;
  const char* cmp = selects_max(k) ? ">" : "<";
  // argmax stores the index; max.dim the value (exact: it is an input) and the index.
  const char* store = k == ReduceKind::kArgMax || k == ReduceKind::kArgMin ? "out0[o] = s.i;"
                                                                           : "out0[o] = sto(s.v); out1[o] = s.i;";
  return std::string(narrow ? "typedef int KcIdx;\n#define KC_IDX_NONE 0x7fffffff\n"
                            : "typedef long long KcIdx;\n#define KC_IDX_NONE 0x7fffffffffffffffLL\n") +
         R"CU(struct S { float v; KcIdx i; };
__device__ __forceinline__ S kc_init() { return S{)CU" + (selects_max(k) ? "-KC_INF" : "KC_INF") +
         R"CU(, KC_IDX_NONE}; }
// a (at index ia) beats b: NaN beats numbers, then the better value, then the lower index.
__device__ __forceinline__ bool kc_better(float a, KcIdx ia, float b, KcIdx ib) {
  if (a != a) return b == b || ia < ib;
  if (b != b) return false;
  return a )CU" + cmp + R"CU( b || (a == b && ia < ib);
}
__device__ __forceinline__ void kc_add(S& s, float v, long long j) { if (kc_better(v, (KcIdx)j, s.v, s.i)) { s.v = v; s.i = (KcIdx)j; } }
__device__ __forceinline__ void kc_merge(S& a, const S& b) { if (kc_better(b.v, b.i, a.v, a.i)) a = b; }
// A chunk (indices rising with q): its best by float compares alone, strict so the first of equal
// values stays and the first NaN is never replaced, then one indexed merge. Element by element,
// kc_better's 64-bit index compares made min.dim over rows of 1023 bf16 compute-bound (92% of
// the SM's issue on an H100).
#define KC_ADD_N 1
template <int N, class J> __device__ __forceinline__ void kc_add_n(S& a, const float (&f)[N], int nq, J j) {
  float v = f[0];
  int p = 0;
#pragma unroll
  for (int q = 1; q < N; ++q)
    if (q < nq && v == v && (f[q] )CU" + std::string(cmp) + R"CU( v || f[q] != f[q])) { v = f[q]; p = q; }
  kc_add(a, v, j(p));
}
__device__ __forceinline__ S kc_shfl(const S& s, int o) {
  return S{__shfl_down_sync(0xffffffffu, s.v, o), __shfl_down_sync(0xffffffffu, s.i, o)};
}
__device__ __forceinline__ void kc_store(KC_OUT_PARAMS, long long o, const S& s) { )CU" + store + " }\n";
}

// var, std, var_mean, std_mean: Welford's count, mean and sum of squared deviations.
std::string welford_state(const ReduceGeom& g) {
  const ReduceKind k = g.kind;
  const bool sd = k == ReduceKind::kStd || k == ReduceKind::kStdMean;
  const bool two = k == ReduceKind::kVarMean || k == ReduceKind::kStdMean;
  const std::string corr = flit(g.correction);
  return std::string(R"CU(struct S { float n, m, q; };   // Welford: count, mean, sum of squared deviations
__device__ __forceinline__ S kc_init() { return S{0.f, 0.f, 0.f}; }
__device__ __forceinline__ void kc_add(S& s, float v, long long) {
  s.n += 1.f;
  const float d = v - s.m;
  s.m += d / s.n;
  s.q += d * (v - s.m);
}
// Chan's merge; a state with no elements leaves the other unchanged.
__device__ __forceinline__ void kc_merge(S& a, const S& b) {
  if (b.n == 0.f) return;
  if (a.n == 0.f) { a = b; return; }
  const float n = a.n + b.n, d = b.m - a.m, f = b.n / n;
  a.m += d * f;
  a.q += b.q + d * d * a.n * f;
  a.n = n;
}
// A chunk of N loaded values as one state: its mean (scaled before summing, so no overflow), its
// squared deviations from that mean (two passes over registers), one merge. Element by element
// Welford is a serial chain with a division an element, which made var_mean compute-bound in bf16
// (0.48x torch.compile on the H200); the chunk's two passes are also the more accurate.
#define KC_ADD_N 1
template <int N, class J> __device__ __forceinline__ void kc_add_n(S& a, const float (&f)[N], int nq, J) {
  const float w = 1.f / (float)nq;
  float m = 0.f;
#pragma unroll
  for (int q = 0; q < N; ++q)
    if (q < nq) m += f[q] * w;
  float sq = 0.f;
#pragma unroll
  for (int q = 0; q < N; ++q)
    if (q < nq) { const float d = f[q] - m; sq = fmaf(d, d, sq); }
  kc_merge(a, S{(float)nq, m, sq});
}
__device__ __forceinline__ S kc_shfl(const S& s, int o) {
  return S{__shfl_down_sync(0xffffffffu, s.n, o), __shfl_down_sync(0xffffffffu, s.m, o), __shfl_down_sync(0xffffffffu, s.q, o)};
}
// A group of W lanes in three sums instead of five merges (a division and branches each):
// the count, the mean weighted by each lane's share (no n * m to overflow), then each lane's
// squared deviations from that mean plus n (m_i - mean)^2, the parallel formula's exact terms.
// Every lane computes the same; an empty group is the empty state.
#define KC_WARP 1
template <int W = WL> __device__ __forceinline__ S kc_warp(S a) {
  float n = a.n;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  float m = a.n == 0.f ? 0.f : a.m * (a.n / n);
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
  const float d = a.m - m;
  float q = a.n == 0.f ? 0.f : a.q + a.n * d * d;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
  return n == 0.f ? S{0.f, 0.f, 0.f} : S{n, m, q};
}
__device__ __forceinline__ void kc_store(KC_OUT_PARAMS, long long o, const S& s) {
  const float div = fmaxf(s.n - )CU") + corr + R"CU(, 0.f);
  const float var = s.q / div;
  out0[o] = sto()CU" + (sd ? "sqrtf(var)" : "var") + ");\n" + (two ? "  out1[o] = sto(s.m + 0.f * s.q);   // NaN once the fold met inf or NaN, as Welford does\n" : "") + "}\n";
}

std::string logsumexp_state(bool exp2) {
  // Online: the running max m and the sum s of exp(x - m). Equal values add 1 (a row of
  // infinities: inf - inf is NaN), a NaN makes s NaN for good, and an empty state (m = -inf,
  // s = 0) merges as nothing. Not __expf: the static check refuses approximate intrinsics.
  // Knob exp2: exp(x) as exp2f(x * log2 e), fewer instructions an element than expf's range
  // reduction; the search keeps whichever is faster. Both are within 2 ulp; rounding the
  // product costs about |x| ulp of a term exp(x) that is e^|x| below the row's largest.
  return std::string(exp2 ? "__device__ __forceinline__ float kc_exp(float x) { return exp2f(x * 1.44269504088896341f); }\n"
                          : "__device__ __forceinline__ float kc_exp(float x) { return expf(x); }\n") +
         R"CU(struct S { float m, s; };
__device__ __forceinline__ S kc_init() { return S{-KC_INF, 0.f}; }
__device__ __forceinline__ void kc_add(S& a, float v, long long) {
  if (v > a.m) { a.s = a.s * kc_exp(a.m - v) + 1.f; a.m = v; }
  else a.s += v == a.m ? 1.f : kc_exp(v - a.m);
}
// The larger max's own sum is not rescaled: inf - inf would be NaN.
__device__ __forceinline__ void kc_merge(S& a, const S& b) {
  if (b.m == a.m) { a.s += b.s; return; }
  if (b.m > a.m) { a.s = a.s * kc_exp(a.m - b.m) + b.s; a.m = b.m; }
  else a.s += b.s * kc_exp(b.m - a.m);
}
// A chunk: its max first (independent of the running state), one exp a value, one merge; a NaN
// (which fmaxf skips) reaches the sum through its exp.
#define KC_ADD_N 1
template <int N, class J> __device__ __forceinline__ void kc_add_n(S& a, const float (&f)[N], int nq, J) {
  float m = f[0];
#pragma unroll
  for (int q = 1; q < N; ++q)
    if (q < nq) m = fmaxf(m, f[q]);
  float s = 0.f;
#pragma unroll
  for (int q = 0; q < N; ++q)
    if (q < nq) s += f[q] == m ? 1.f : kc_exp(f[q] - m);
  kc_merge(a, S{m, s});
}
__device__ __forceinline__ S kc_shfl(const S& s, int o) {
  return S{__shfl_down_sync(0xffffffffu, s.m, o), __shfl_down_sync(0xffffffffu, s.s, o)};
}
// A group of W lanes in two cheap steps instead of five merges (an exp and branches each): the largest max
// by shuffles, then every lane's sum rescaled to it once and added by shuffles. A lane at that
// max (+inf among them) is not rescaled; an empty lane adds 0 * exp(-inf) = 0.
#define KC_WARP 1
template <int W = WL> __device__ __forceinline__ S kc_warp(S a) {
  float m = a.m;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float s = a.m == m ? a.s : a.s * kc_exp(a.m - m);
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return S{m, s};
}
__device__ __forceinline__ void kc_store(KC_OUT_PARAMS, long long o, const S& s) { out0[o] = sto(s.m + logf(s.s)); }
)CU";
}

// One float: max/min (and the inf norms), prod, sum, mean and the p-norms.
std::string scalar_state(const ReduceGeom& g) {
  const ReduceKind k = g.kind;
  const bool pick = k == ReduceKind::kMax || k == ReduceKind::kMin || (k == ReduceKind::kNorm && g.ord != NormOrd::kP);
  std::string s = "typedef float S;\n__device__ __forceinline__ S kc_shfl(const S& s, int o) { return __shfl_down_sync(0xffffffffu, s, o); }\n";
  if (pick) {
    const bool max = k == ReduceKind::kMax || (k == ReduceKind::kNorm && g.ord == NormOrd::kInf);
    const std::string w = k == ReduceKind::kNorm ? "fabsf(v)" : "v";
    const char* cmp = max ? ">" : "<";
    // NaN is sticky: once the state is NaN no comparison replaces it.
    return s + "__device__ __forceinline__ S kc_init() { return " + (max ? "-KC_INF" : "KC_INF") + "; }\n" +
           "__device__ __forceinline__ void kc_merge(S& a, const S& b) { if (b " + cmp + " a || b != b) a = b; }\n" +
           "__device__ __forceinline__ void kc_add(S& s, float v, long long) { kc_merge(s, " + w + "); }\n" +
           "__device__ __forceinline__ void kc_store(KC_OUT_PARAMS, long long o, const S& s) { out0[o] = sto(s); }\n";
  }
  if (k == ReduceKind::kProd)
    return s + "__device__ __forceinline__ S kc_init() { return 1.f; }\n" +
           "__device__ __forceinline__ void kc_merge(S& a, const S& b) { a *= b; }\n" +
           "__device__ __forceinline__ void kc_add(S& s, float v, long long) { s *= v; }\n" +
           "__device__ __forceinline__ void kc_store(KC_OUT_PARAMS, long long o, const S& s) { out0[o] = sto(s); }\n";
  std::string term = "v", fin = "s";
  if (k == ReduceKind::kMean) fin = "s / " + S(g.r) + ".f";
  if (k == ReduceKind::kNorm) {
    const std::string p = flit(g.p);
    if (g.p == 1) term = "fabsf(v)";
    else if (g.p == 2) term = "v * v", fin = "sqrtf(s)";
    else term = std::string("powf(fabsf(v), ") + p + ")", fin = std::string("powf(s, 1.f / ") + p + ")";
  }
  return s + "__device__ __forceinline__ S kc_init() { return 0.f; }\n" +
         "__device__ __forceinline__ void kc_add(S& s, float v, long long) { s += " + term + "; }\n" +
         "__device__ __forceinline__ void kc_merge(S& a, const S& b) { a += b; }\n" +
         "__device__ __forceinline__ void kc_store(KC_OUT_PARAMS, long long o, const S& s) { out0[o] = sto(" + fin + "); }\n";
}

}  // namespace

std::string reduction_fold_state(const ReduceGeom& g, bool exp2) {
  if (indexed(g.kind)) return indexed_state(g.kind, g.r);
  if (welford(g.kind)) return welford_state(g);
  if (g.kind == ReduceKind::kLogSumExp) return logsumexp_state(exp2);
  return scalar_state(g);
}

int64_t reduction_state_bytes(ReduceKind k) {
  if (indexed(k)) return 16;
  if (welford(k)) return 12;
  if (k == ReduceKind::kLogSumExp) return 8;
  return 4;
}

}  // namespace kc::evolve::cuda_tpl
