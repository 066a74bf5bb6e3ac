// The float-atomic variant of the CUDA embedding backward template (knob `atomic`,
// templates_cuda_embedding_backward.cpp), in a file of its own so the deterministic sort and this
// variant each read in one sitting.
#include "evolve/propose/templates_cuda_embedding_backward.h"

#include <string>

#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve::cuda_tpl {
namespace {

// The atomic variant (knob `atomic`, fp32 without scale_grad_by_freq): the output zeroed, then
// a warp per position adds its grad row into its index's row with float atomics (atomic = 2: in
// vectors where the GPU has them); padding_idx and indices outside [0, W) reach no row. Two
// launches and no sort, the scheme torch.compile uses. The additions into a row land in whatever
// order the warps run, so the result is not bitwise repeatable: the candidate says so
// (Candidate::repeatable), the record says "varies" even where the gauntlet's runs agreed, and
// where the user asks for deterministic algorithms the runtime answers with eager instead.
const char* const kEbwAtomicBody = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
// Adds a loaded vector into o: with VATOM on sm_90 and later one float2 / float4 atomic (a
// quarter of the atomic instructions at VEC 4), else one atomic an element.
__device__ __forceinline__ void kc_vadd(T* o, const V& x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (VATOM && VEC == 4) {
    atomicAdd(reinterpret_cast<float4*>(o), make_float4(x.v[0], x.v[1], x.v[2], x.v[3]));
    return;
  } else if constexpr (VATOM && VEC == 2) {
    atomicAdd(reinterpret_cast<float2*>(o), make_float2(x.v[0], x.v[1]));
    return;
  }
#endif
#pragma unroll
  for (int e = 0; e < VEC; ++e) atomicAdd(o + e, x.v[e]);
}
extern "C" __global__ void __launch_bounds__(256) kc_ebw_zero(T* __restrict__ out, long long nv) {
  V z;
#pragma unroll
  for (int e = 0; e < VEC; ++e) z.v[e] = 0.f;
  V* ov = reinterpret_cast<V*>(out);
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < nv; i += (long long)gridDim.x * 256) ov[i] = z;
}
extern "C" __global__ void __launch_bounds__(32 * RPB) kc_ebw_atomic(T* __restrict__ out, const T* __restrict__ g,
    const IT* __restrict__ idx, int n, long long W, long long pad, long long DV) {
  const int lane = threadIdx.x & 31;
  const long long p = (long long)blockIdx.x * RPB + (threadIdx.x >> 5);
  if (p >= n) return;
  const long long w = (long long)idx[p];
  if (w < 0 || w >= W || w == pad) return;
  const V* gv = reinterpret_cast<const V*>(g) + p * DV;
  T* orow = out + w * DV * VEC;
  for (long long col = lane; col < DV; col += 32) kc_vadd(orow + col * VEC, gv[col]);
}
)CU";

}  // namespace

std::string ebw_atomic_body(bool vectors) {
  return std::string("constexpr bool VATOM = ") + (vectors ? "true" : "false") + ";\n" + kEbwAtomicBody;
}

nlohmann::json ebw_atomic_launches(int64_t vec, int64_t rows) {
  const std::string nv = "num_weights * size(grad_output,-1) / " + S(vec);
  nlohmann::json ls = nlohmann::json::array();
  ls.push_back(launch("kc_ebw_zero", {"min(ceil_div(" + nv + ", 256), " + S(kSms * 8) + ")"}, {256}, {"ptr:out0", "i64:" + nv}));
  ls.push_back(launch("kc_ebw_atomic", {"ceil_div(numel(indices), " + S(rows) + ")"}, {32 * rows},
                      {"ptr:out0", "ptr:grad_output", "ptr:indices", "i32:numel(indices)", "i64:num_weights", "i64:padding_idx",
                       "i64:size(grad_output,-1) / " + S(vec)}));
  return ls;
}

}  // namespace kc::evolve::cuda_tpl
