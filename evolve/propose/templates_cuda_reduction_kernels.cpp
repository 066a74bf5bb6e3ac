// The device code of the CUDA reduction template (templates_cuda_reduction.cpp, which says what
// each kernel does and which knobs shape it): the fold helpers and the rows, split, finishing and
// columns kernels, and the two-run kernel. They fold through a state of
// templates_cuda_reduction_states.cpp and find their row through kc_row_of (kRowOf).
#include <string>

#include "evolve/propose/templates_cuda_reduction.h"

namespace kc::evolve::cuda_tpl {
namespace {

const char* kReduceBody = R"CU(
// Folds the first nq (1 to N) of N loaded values, value q at index j(q), indices rising with q.
// The default adds them one by one; a state whose add is a serial chain (logsumexp's running max,
// Welford's division, argmax's index compares) folds them as one chunk instead (KC_ADD_N).
#ifndef KC_ADD_N
template <int N, class J> __device__ __forceinline__ void kc_add_n(S& a, const float (&f)[N], int nq, J j) {
#pragma unroll
  for (int q = 0; q < N; ++q)
    if (q < nq) kc_add(a, f[q], j(q));
}
#endif
// The state of a group of W lanes (a row's WL; the finishing merge's whole warp), valid in its
// first lane; a state whose merge is costly defines its own (KC_WARP).
#ifndef KC_WARP
template <int W = WL> __device__ __forceinline__ S kc_warp(S a) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) { const S b = kc_shfl(a, o); kc_merge(a, b); }
  return a;
}
#endif
// The state of a group of G threads (see the row kernels), valid in its thread 0.
__device__ __forceinline__ S kc_group(S a, S* sh) {
  a = kc_warp(a);
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int w = 1; w < G / 32; ++w) kc_merge(a, sh[w]);
  }
  return a;
}
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
// Elements [lo, hi) of a row folded by thread t of a group of G. The row may start anywhere and
// have any length (a row of 4095 floats is misaligned every other row): scalar loads up to the
// first VEC-aligned element and after the last whole vector, VEC-wide loads between, so odd
// rows get wide loads too (at one element a load, logsumexp over rows of 1023 floats ran at
// 0.81x torch.compile on the H200).
__device__ __forceinline__ S kc_fold_row(const T* __restrict__ row, long long lo, long long hi, int t) {
  S a = kc_init();
  long long b = lo;
  if constexpr (VEC > 1) {
    const long long mis = (long long)((reinterpret_cast<unsigned long long>(row + lo) / sizeof(T)) % VEC);
    b = mis ? min(hi, lo + VEC - mis) : lo;
    if (lo + t < b) kc_add(a, ld(row[lo + t]), lo + t);
  }
  const V* v = reinterpret_cast<const V*>(row + b);
  const long long e = (hi - b) / VEC;   // whole vectors from b
  long long i = t;
  for (; i + (U - 1) * G < e; i += U * G) {
    V r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = v[i + u * G];
    float f[U * VEC];
#pragma unroll
    for (int q = 0; q < U * VEC; ++q) f[q] = ld(r[q / VEC].v[q % VEC]);
    kc_add_n(a, f, U * VEC, [&](int q) { return b + (i + (q / VEC) * G) * VEC + q % VEC; });
  }
  // This lane's last 1 to U - 1 vectors, loaded together and folded as one chunk: one vector a
  // step here left a row of 127 vectors (1023 bf16) waiting on one lane's three serial merges.
  if (i < e) {
    const int nu = (int)((e - i + G - 1) / G);
    V r[U] = {};
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < nu) r[u] = v[i + u * G];
    float f[U * VEC];
#pragma unroll
    for (int q = 0; q < U * VEC; ++q) f[q] = q / VEC < nu ? ld(r[q / VEC].v[q % VEC]) : 0.f;
    kc_add_n(a, f, nu * VEC, [&](int q) { return b + (i + (q / VEC) * G) * VEC + q % VEC; });
  }
  if constexpr (VEC > 1) {
    const long long j = b + e * VEC + t;
    if (j < hi) kc_add(a, ld(row[j]), j);
  }
  return a;
}
extern "C" __global__ void __launch_bounds__(NT) kc_red_rows(KC_OUT_PARAMS, const T* __restrict__ x, long long M,
                                                             long long R) {
  __shared__ S sh[32];
  int t;
  long long row;
  bool live;
  if (!kc_row_of(M, t, row, live)) return;
  const S a = kc_group(kc_fold_row(x + (live ? row : 0) * R, 0, live ? R : 0, t), sh);
  if (t == 0 && live) kc_store(KC_OUT_ARGS, row, a);
}
// Block b folds chunk b % SP of row b / SP (G == NT: a block per chunk).
extern "C" __global__ void __launch_bounds__(NT) kc_red_rows_part(S* __restrict__ part, const T* __restrict__ x,
                                                                  long long R, int SP, long long CH) {
  __shared__ S sh[32];
  const long long row = blockIdx.x / SP, lo = (blockIdx.x % SP) * CH;
  const S a = kc_group(kc_fold_row(x + row * R, lo, min(R, lo + CH), threadIdx.x), sh);
  if (threadIdx.x == 0) part[blockIdx.x] = a;
}
// A warp per output merges its SP partial states in order.
extern "C" __global__ void __launch_bounds__(256) kc_red_finish(KC_OUT_PARAMS, const S* __restrict__ part,
                                                                long long NOUT, int SP) {
  const long long o = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (o >= NOUT) return;
  const int lane = threadIdx.x & 31;
  S a = kc_init();
  for (int q = lane; q < SP; q += 32) kc_merge(a, part[o * SP + q]);
  a = kc_warp<32>(a);   // every lane's states, whatever the rows' group width WL
  if (lane == 0) kc_store(KC_OUT_ARGS, o, a);
}
struct alignas(sizeof(T) * VB) VW { T v[VB]; };
// Columns: block (o, tile) in grid x, chunk of rows in grid y; thread (tx, ty) folds columns
// c0 .. c0 + VB - 1 over rows lo + ty, lo + ty + TY, ... < hi. Returns in ty == 0 threads.
__device__ __forceinline__ bool kc_fold_cols(S a[VB], S* sh, const T* __restrict__ x, long long I, long long R,
                                             long long TILES, long long lo, long long hi, long long& col) {
  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
  const long long o = blockIdx.x / TILES, c0 = ((blockIdx.x % TILES) * TX + tx) * VB;
#pragma unroll
  for (int k = 0; k < VB; ++k) a[k] = kc_init();
  if (c0 < I) {
    const T* base = x + o * R * I + c0;
    long long r = lo + ty;
    for (; r + (U - 1) * TY < hi; r += U * TY) {
      VW w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) w[u] = *reinterpret_cast<const VW*>(base + (r + u * TY) * I);
#pragma unroll
      for (int k = 0; k < VB; ++k) {
        float f[U];
#pragma unroll
        for (int u = 0; u < U; ++u) f[u] = ld(w[u].v[k]);
        kc_add_n(a[k], f, U, [&](int u) { return r + u * TY; });
      }
    }
    for (; r < hi; r += TY) {
      const VW w = *reinterpret_cast<const VW*>(base + r * I);
#pragma unroll
      for (int k = 0; k < VB; ++k) kc_add(a[k], ld(w.v[k]), r);
    }
  }
  if constexpr (TY > 1) {
#pragma unroll
    for (int k = 0; k < VB; ++k) sh[threadIdx.x * VB + k] = a[k];
    __syncthreads();
    if (ty == 0)
      for (int w = 1; w < TY; ++w)
#pragma unroll
        for (int k = 0; k < VB; ++k) kc_merge(a[k], sh[(w * TX + tx) * VB + k]);
  }
  col = o * I + c0;
  return ty == 0 && c0 < I;
}
extern "C" __global__ void __launch_bounds__(NT) kc_red_cols(KC_OUT_PARAMS, const T* __restrict__ x, long long I,
                                                             long long R, long long TILES) {
  __shared__ S sh[TY > 1 ? NT * VB : 1];
  S a[VB];
  long long col;
  if (kc_fold_cols(a, sh, x, I, R, TILES, 0, R, col))
#pragma unroll
    for (int k = 0; k < VB; ++k) kc_store(KC_OUT_ARGS, col + k, a[k]);
}
extern "C" __global__ void __launch_bounds__(NT) kc_red_cols_part(S* __restrict__ part, const T* __restrict__ x,
                                                                  long long I, long long R, long long TILES, long long CH) {
  __shared__ S sh[TY > 1 ? NT * VB : 1];
  S a[VB];
  long long col;
  const long long lo = blockIdx.y * CH;
  if (kc_fold_cols(a, sh, x, I, R, TILES, lo, min(R, lo + CH), col))
#pragma unroll
    for (int k = 0; k < VB; ++k) part[(col + k) * gridDim.y + blockIdx.y] = a[k];
}
)CU";

// Two runs: row (j1, m) of r2 contiguous elements is row j1 * M + m; its state goes to
// part[m * R1 + j1], so kc_red_finish (SP = R1) merges each output's states in j1 order.
const char* kSegBody = R"CU(
extern "C" __global__ void __launch_bounds__(NT) kc_red_seg_part(S* __restrict__ part, const T* __restrict__ x,
                                                                 long long M, long long R1, long long R2) {
  __shared__ S sh[32];
  int t;
  long long row;
  bool live;
  if (!kc_row_of(M * R1, t, row, live)) return;
  const S a = kc_group(kc_fold_row(x + (live ? row : 0) * R2, 0, live ? R2 : 0, t), sh);
  if (t == 0 && live) part[(row % M) * R1 + row / M] = a;
}
)CU";

}  // namespace

std::string reduction_kernels(bool two_runs) { return std::string(kReduceBody) + (two_runs ? kSegBody : ""); }

}  // namespace kc::evolve::cuda_tpl
