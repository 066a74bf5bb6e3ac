// The norm templates' shared pieces (layer norm forward and backward, RMSNorm forward and
// backward, group norm's split, the fused cluster launch of batch norm and group norm): row
// geometry, split and fuse knobs, optional parameter lists and the element type of their device
// code. Internal to evolve/.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve::cuda_tpl {

// Layer norm geometry; split knobs (layer norm, RMSNorm, group norm); parameter lists.

inline const std::vector<int64_t> kSplits = {33, 66, 132, 264, 528, 1056};

// Number of rows M and row length N of a layer norm call (forward: input + normalized_shape), whose
// input is f32, bf16 or f16.
inline bool ln_geometry(const OpCall& c, int64_t& M, int64_t& N) {
  const TensorMeta* x = c.input("input");
  if (!x || !x->defined || !elem_dtype(x->dtype)) return false;
  auto ns = c.list_arg("normalized_shape");
  const int64_t nd = static_cast<int64_t>(x->sizes.size());
  if (ns.empty() || static_cast<int64_t>(ns.size()) > nd) return false;
  N = 1;
  for (size_t i = 0; i < ns.size(); ++i) {
    if (x->sizes[nd - ns.size() + i] != ns[i]) return false;
    N *= ns[i];
  }
  if (N <= 0 || x->numel() == 0) return false;
  M = x->numel() / N;
  return N <= INT_MAX / 2 && M <= INT_MAX;
}

// An absent parameter, or N elements of the input's dtype (CUDA eager refuses mixed parameters).
inline bool ln_param_ok(const TensorMeta* t, int64_t N, DType dt) {
  return !t || !t->defined || (t->dtype == dt && t->numel() == N);
}

// Split knob values worth trying: chunks of at least 1024 elements, at most 2^31 blocks.
inline std::vector<int64_t> split_values(int64_t M, int64_t N) {
  std::vector<int64_t> v = {0};
  for (int64_t s : kSplits)
    if (N / s >= 1024 && M * s <= INT_MAX) v.push_back(s);
  // Default: split when rows are too few to fill the GPU, aiming at ~4 blocks per SM.
  int64_t def = 0;
  if (M < 2 * kSms)
    for (int64_t s : v)
      if (s > 0 && (def == 0 || M * def < 4 * kSms)) def = s;
  return with_default(v, def);
}

// The fused launch (batch norm, group norm): a cluster of CL blocks a row (a channel), each block
// the statistics of its slice, the cluster's partials combined after a cluster barrier, then the
// same block normalizes the same slice. Its second read comes from L2 only if the slices read at
// once fit there (the H200's L2 is 50 MB); with 128-256 KB fp32 slices and eight 256-thread
// blocks an SM they do not (fp32 instance norm, (1,1024,256,256)).
// Blocks a row: 0 (not fused) or a power of two up to 8 (the portable cluster size) with at
// least 1024 elements a slice. Default: the fewest whose slices are at most 256 KB with at least
// one block an SM; 0 where a row needs more than 8 such slices.
inline std::vector<int64_t> fuse_values(int64_t rows, int64_t elems, int64_t elem_bytes) {
  std::vector<int64_t> v = {0};
  for (int64_t p = 1; p <= 8 && rows * p <= INT_MAX; p *= 2)
    if (p == 1 || elems / p >= 1024) v.push_back(p);
  int64_t def = 0;
  for (int64_t p : v)
    if (p > 0 && elems * elem_bytes / p <= (int64_t{256} << 10) && rows * p >= kSms) { def = p; break; }
  return with_default(v, def);
}

// Vectors a thread keeps of its slice when the fused launch holds it in registers (knob regs): a
// row of `vectors` vectors cut into cl slices of nt threads.
inline int64_t slice_items(int64_t vectors, int64_t cl, int64_t nt) { return cdiv(cdiv(vectors, cl), nt); }
// True when ri vectors of vec elements a thread fit nt threads' registers.
inline bool slice_fits(int64_t ri, int64_t vec, int64_t nt) { return ri * vec <= reg_budget(nt); }

// Seeds of the fused launch with its slice in registers (knob regs): for 1024 and 512 threads, the
// fewest blocks a row of `elems` elements in vectors of `vec` whose slices fit the threads'
// registers (fp32 instance norm's 64K-element channels: 4 blocks of 1024 threads).
inline std::vector<Knobs> register_slice_seeds(int64_t rows, int64_t elems, int64_t elem_bytes, int64_t vec) {
  std::vector<int64_t> cls = fuse_values(rows, elems, elem_bytes);
  std::sort(cls.begin(), cls.end());
  std::vector<Knobs> out;
  for (int64_t nt : {1024, 512})
    for (int64_t cl : cls)
      if (cl > 0 && slice_fits(slice_items(elems / vec, cl, nt), vec, nt)) {
        out.push_back({{"fuse", cl}, {"threads", nt}, {"regs", 1}});
        break;
      }
  return out;
}

// Blocks an SM of the fused launch (0: as many as fit), capped by reserving dynamic shared
// memory the kernel does not use.
inline std::vector<int64_t> resident_values() { return {0, 1, 2, 4}; }
inline int64_t reserve_smem(int64_t resident) {
  constexpr int64_t kSmPerSm = 228 << 10, kPerBlock = 1 << 10, kStatic = 1 << 10;
  return resident > 0 ? kSmPerSm / resident - kPerBlock - kStatic : 0;
}

// The fused launch's compile-time cluster: CL blocks, `__cluster_dims__` where CL > 1.
inline std::string cluster_consts(int64_t cl) {
  return "#define CL " + S(cl) + "\n#define KC_CLUSTER_DIMS" + (cl > 1 ? " __cluster_dims__(CL, 1, 1)\n" : "\n");
}

// Device helpers of the fused launches (batch norm, group norm), after kGroupHelpers and the
// constants NT, VEC, RI (vectors a thread keeps of its slice, 0: streamed) and CL.
inline constexpr const char* kFusedNormHelpers = R"CU(
__device__ __forceinline__ void kc_vstats(const V& v, float& vm, float& vq) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) s += ld(v.v[e]);
  vm = s * (1.f / VEC);
  vq = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) { const float d = ld(v.v[e]) - vm; vq += d * d; }
}
// The vectors of slice p of P of a row (a channel) of TOTV vectors.
__device__ __forceinline__ long long kc_slice(long long TOTV, int P) { return (TOTV + P - 1) / P; }
#if CL > 0
// A block's statistics from the RI vectors a thread holds (rv[k]: vector lo + threadIdx.x + k * NT
// of the slice, where below hi): the mean, then the squares about it; none for an empty slice.
__device__ __forceinline__ KcW kc_regs_stats(const V* rv, long long lo, long long hi, float* sh) {
  float s = 0.f, q = 0.f;
#pragma unroll
  for (int k = 0; k < RI; ++k)
    if (lo + threadIdx.x + (long long)k * NT < hi)
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += ld(rv[k].v[e]);
  const float nb = (float)(max(0LL, hi - lo) * VEC), tot = kc_gsum(s, sh), mb = nb > 0.f ? tot / nb : 0.f;
#pragma unroll
  for (int k = 0; k < RI; ++k)
    if (lo + threadIdx.x + (long long)k * NT < hi)
#pragma unroll
      for (int e = 0; e < VEC; ++e) { const float d = ld(rv[k].v[e]) - mb; q += d * d; }
  q = kc_gsum(q, sh);
  return nb > 0.f ? KcW{nb, mb, q} : KcW{0.f, 0.f, 0.f};
}
// The cluster's statistics (CL > 1): block p's partial into part[2 * (base + p)], a cluster
// barrier, then the CL partials of slices of `per` of `tot` vectors combined in order, so every
// block of the cluster agrees bit for bit.
__device__ __forceinline__ void kc_cluster_merge(KcW& a, float* part, long long base, int p, long long per, long long tot) {
  if (threadIdx.x == 0) { part[2 * (base + p)] = a.m; part[2 * (base + p) + 1] = a.q; }
  __threadfence();
  __cluster_barrier_arrive();   // release: the partials written above are visible after the wait
  __cluster_barrier_wait();
  a = KcW{0.f, 0.f, 0.f};
  for (int r = 0; r < CL; ++r) {
    const long long nv = min(per, max(0LL, tot - (long long)r * per));
    const float* pr = part + 2 * (base + r);
    kc_wadd(a, (float)(nv * VEC), __ldcg(pr), __ldcg(pr + 1));
  }
}
#endif
)CU";

// Parameter lists for optional tensors of element type `elem`: the launch spec may only name
// defined ones.
inline std::string opt_params(const std::vector<std::pair<std::string, bool>>& ps, const char* macro, const char* locals,
                              const std::string& elem = "float") {
  std::string params = "#define " + std::string(macro), loc = "#define " + std::string(locals);
  for (const auto& [n, on] : ps) {
    if (on) params += " , const " + elem + "* __restrict__ " + n;
    else loc += " const " + elem + "* " + n + " = nullptr; (void)" + n + ";";
  }
  return params + "\n" + loc + "\n";
}

// The layer norm bodies name their element type KC_ELEM and its VEC-wide vector KC_VECT: float and
// V for f32, which renders the fp32 sources byte for byte as before the halves (their digests
// hold), and for bf16 / f16 KcE, a 16-bit word that reads as float (ld) and rounds to nearest even
// when a float is stored into it (st), so the arithmetic stays fp32 and every output rounds once.
inline const char* ln_elem(DType d) { return d == DType::kF32 ? "float" : "KcE"; }

inline std::string ln_body(const char* body, DType d) {
  return replace_all(replace_all(body, "KC_ELEM", ln_elem(d)), "KC_VECT", d == DType::kF32 ? "V" : "KcVE");
}

// KcE and KcVE for halves (after dtype_prelude and row_consts: ld, st, VEC); nothing for f32.
inline std::string ln_elem_prelude(DType d) {
  if (d == DType::kF32) return "";
  return R"CU(struct KcE {
  T u;
  __device__ __forceinline__ operator float() const { return ld(u); }
  __device__ __forceinline__ KcE& operator=(float f) { u = st(f); return *this; }
};
struct alignas(sizeof(KcE) * VEC) KcVE { KcE v[VEC]; };
)CU";
}

}  // namespace kc::evolve::cuda_tpl
