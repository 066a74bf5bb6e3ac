// The device source of the CUDA group norm template (templates_cuda_group_norm.cpp, which says
// what each kernel does and which knob picks it): the row kernel, the split's two launches and the
// fused cluster launch.
#include "evolve/propose/templates_cuda_group_norm.h"

namespace kc::evolve::cuda_tpl {
namespace {

const char* kBody = R"CU(
// Per-channel affine folded into one multiply-add: y = x * a + c.
__device__ __forceinline__ void kc_affine(long long ch, float mu, float rs, const PT* w, const PT* b, float& a, float& c) {
  a = rs;
  if constexpr (HAS_W) a = rs * ldp(w[ch]);
  c = -mu * a;
  if constexpr (HAS_B) c = ldp(b[ch]) - mu * a;
}
__device__ __forceinline__ V kc_apply(const V& v, float a, float c) {
  V o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) o.v[e] = st(fmaf(ld(v.v[e]), a, c));
  return o;
}
// The channel of vector i = t, t + G, t + 2G, ... of a row of planes of hwv vectors, tracked
// without a division per vector; the affine is reloaded only when the channel changes.
struct KcChan {
  int cl, rem, dq, dr, hwv, cur;
  float a, c;
  __device__ __forceinline__ KcChan(int t, int hv) : cl(t / hv), rem(t % hv), dq(G / hv), dr(G % hv), hwv(hv), cur(-1) {}
  __device__ __forceinline__ void at(long long ch0, float mu, float rs, const PT* w, const PT* b) {
    if (cl != cur) { cur = cl; kc_affine(ch0 + cl, mu, rs, w, b, a, c); }
  }
  __device__ __forceinline__ void next() {
    cl += dq; rem += dr;
    if (rem >= hwv) { rem -= hwv; ++cl; }
  }
};
__device__ __forceinline__ long long kc_chunk(long long L, int S) { return ((L + S - 1) / S + VEC - 1) / VEC * VEC; }

extern "C" __global__ void __launch_bounds__(NT) kc_group_norm(T* __restrict__ y, ST* __restrict__ mean,
    ST* __restrict__ rstd, const T* __restrict__ x KC_WB_PARAMS, long long M, int L, int HW, int CPG, int GROUPS,
    float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const V* xv = reinterpret_cast<const V*>(x + row * L);
  V* yv = reinterpret_cast<V*>(y + row * L);
  const int nv = L / VEC;
  const float fL = (float)L;
  const long long ch0 = (row % GROUPS) * CPG;
  KcChan ch(t, HW / VEC);
  float mu, rs;
  if constexpr (ITEMS > 0) {
    // Corrected two-pass from registers: the mean, then the deviations' sum (fixes the mean's
    // rounding) and squares.
    V r[ITEMS > 0 ? ITEMS : 1];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
      if (k * G + t < nv) {
        r[k] = xv[k * G + t];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += ld(r[k].v[e]);
      }
    mu = kc_gsum(s, sh) / fL;
    float sd = 0.f, q = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
      if (k * G + t < nv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) { const float d = ld(r[k].v[e]) - mu; sd += d; q += d * d; }
    kc_gsum2(sd, q, sh);
    const float dm = sd / fL;
    mu += dm;
    rs = rsqrtf(fmaxf(q / fL - dm * dm, 0.f) + eps);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
      if (k * G + t < nv) {
        ch.at(ch0, mu, rs, w, b);
        yv[k * G + t] = kc_apply(r[k], ch.a, ch.c);
        ch.next();
      }
  } else {
    KcW a{0.f, 0.f, 0.f};
    for (int i = t; i < nv; i += G) {
      float vm, vq;
      kc_vstats(xv[i], vm, vq);
      kc_wadd(a, (float)VEC, vm, vq);
    }
    kc_gwelford(a, sh);
    mu = a.m;
    rs = rsqrtf(fmaxf(a.q / fL, 0.f) + eps);
    for (int i = t; i < nv; i += G) {
      ch.at(ch0, mu, rs, w, b);
      yv[i] = kc_apply(xv[i], ch.a, ch.c);
      ch.next();
    }
  }
  if (t == 0) { mean[row] = sts(mu); rstd[row] = sts(rs); }
}

extern "C" __global__ void __launch_bounds__(NT) kc_group_norm_part(float* __restrict__ part, const T* __restrict__ x,
                                                                    long long L, int S) {
  __shared__ float sh[96];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(L, S);
  const long long lo = c * C, hi = min(L, lo + C);
  const V* xv = reinterpret_cast<const V*>(x + row * L);
  KcW a{0.f, 0.f, 0.f};
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) {
    float vm, vq;
    kc_vstats(xv[i], vm, vq);
    kc_wadd(a, (float)VEC, vm, vq);
  }
  kc_gwelford(a, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = a.m; part[2 * (long long)blockIdx.x + 1] = a.q; }
}

// Grid: N * C planes times P pieces of KA * NT vectors each.
extern "C" __global__ void __launch_bounds__(NT) kc_group_norm_apply(T* __restrict__ y, ST* __restrict__ mean,
    ST* __restrict__ rstd, const T* __restrict__ x KC_WB_PARAMS, const float* __restrict__ part, int C, int HW,
    int CPG, int S, int P, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const long long plane = blockIdx.x / P;   // n * C + c
  const int p = blockIdx.x % P, c = (int)(plane % C);
  const long long row = plane / CPG;        // n * group + c / CPG, since C = group * CPG
  const long long L = (long long)CPG * HW, K = kc_chunk(L, S);
  const float* pr = part + 2 * row * S;
  KcW a{0.f, 0.f, 0.f};
  for (int q = threadIdx.x; q < S; q += NT) {
    const long long n = min(K, max(0LL, L - q * K));
    kc_wadd(a, (float)n, pr[2 * q], pr[2 * q + 1]);
  }
  kc_gwelford(a, sh);
  const float mu = a.m, rs = rsqrtf(fmaxf(a.q / (float)L, 0.f) + eps);
  if (c % CPG == 0 && p == 0 && threadIdx.x == 0) { mean[row] = sts(mu); rstd[row] = sts(rs); }
  float fa, fc;
  kc_affine(c, mu, rs, w, b, fa, fc);
  const V* xv = reinterpret_cast<const V*>(x + plane * HW);
  V* yv = reinterpret_cast<V*>(y + plane * HW);
  const int hwv = HW / VEC;
#pragma unroll
  for (int k = 0; k < KA; ++k) {
    const int i = (p * KA + k) * NT + (int)threadIdx.x;
    if (i < hwv) yv[i] = kc_apply(xv[i], fa, fc);
  }
}

#if CL > 0
// Grid: M * CL blocks of G = NT threads; the CL blocks of row (n, g) form one cluster.
extern "C" __global__ void __launch_bounds__(NT) KC_CLUSTER_DIMS kc_group_norm_fused(T* __restrict__ y,
    ST* __restrict__ mean, ST* __restrict__ rstd, float* __restrict__ part, const T* __restrict__ x KC_WB_PARAMS,
    int L, int HW, int CPG, int GROUPS, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const long long row = blockIdx.x / CL;
  const int p = blockIdx.x % CL, nv = L / VEC, per = (int)kc_slice(nv, CL), lo = p * per, hi = min(nv, lo + per);
  const V* xv = reinterpret_cast<const V*>(x + row * L);
  V* yv = reinterpret_cast<V*>(y + row * L);
  KcW a{0.f, 0.f, 0.f};
  // RI > 0 (knob regs): the slice in registers, RI vectors a thread; the block's mean, then its
  // squares about that mean, from the registers, so the second pass reads no memory.
  V rv[RI > 0 ? RI : 1];
  if constexpr (RI > 0) {
#pragma unroll
    for (int k = 0; k < RI; ++k)
      if (lo + (int)threadIdx.x + k * NT < hi) rv[k] = xv[lo + (int)threadIdx.x + k * NT];
    a = kc_regs_stats(rv, lo, hi, sh);
  } else {
    for (int i = lo + (int)threadIdx.x; i < hi; i += NT) {
      float vm, vq;
      kc_vstats(xv[i], vm, vq);
      kc_wadd(a, (float)VEC, vm, vq);
    }
    kc_gwelford(a, sh);
  }
  if constexpr (CL > 1) kc_cluster_merge(a, part, row * CL, p, per, nv);
  const float mu = a.m, rs = rsqrtf(fmaxf(a.q / (float)L, 0.f) + eps);
  if (p == 0 && threadIdx.x == 0) { mean[row] = sts(mu); rstd[row] = sts(rs); }
  KcChan ch(lo + (int)threadIdx.x, HW / VEC);
  const long long ch0 = (row % GROUPS) * CPG;
  if constexpr (RI > 0) {
#pragma unroll
    for (int k = 0; k < RI; ++k)
      if (lo + (int)threadIdx.x + k * NT < hi) {
        ch.at(ch0, mu, rs, w, b);
        yv[lo + (int)threadIdx.x + k * NT] = kc_apply(rv[k], ch.a, ch.c);
        ch.next();
      }
    return;
  }
  for (int i = lo + (int)threadIdx.x; i < hi; i += NT) {
    ch.at(ch0, mu, rs, w, b);
    yv[i] = kc_apply(xv[i], ch.a, ch.c);
    ch.next();
  }
}
#endif
)CU";

}  // namespace

const char* group_norm_kernels() { return kBody; }

}  // namespace kc::evolve::cuda_tpl
