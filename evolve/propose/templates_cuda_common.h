// Shared pieces of the CUDA op-family templates (templates_cuda_*.cpp): knob plumbing, row
// geometry, the dtype prelude and the device-side reduction helpers every row template pastes in.
// Internal to evolve/: the templates are reached through cuda_templates() (proposer.h).
#pragma once
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "evolve/propose/proposer.h"

namespace kc::evolve::cuda_tpl {


using nlohmann::json;

// H100 / H200 SXM. Grid-stride launches size their grid as a multiple of it; elsewhere it only
// shapes defaults, never correctness.
inline constexpr int64_t kSms = 132;
// Their L2 cache (50 MB): defaults choose by whether a second read of a tensor can hit it.
inline constexpr int64_t kL2Bytes = int64_t{50} << 20;
// Static shared memory a block may declare (more needs a dynamic allocation and an opt-in).
inline constexpr int64_t kMaxStaticShared = 48 * 1024;

inline Status unsupported(const std::string& m) { return Status::error(Code::kUnsupported, m); }
inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
inline std::string S(int64_t v) { return std::to_string(v); }

// `body` with its entry placeholder KC_ENTRY replaced by the entry's name, so the rendered source
// names its entry literally.
inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}
inline std::string with_entry(const char* body, const std::string& entry) { return replace_all(body, "KC_ENTRY", entry); }

inline bool elem_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// The element type T with float conversions ld/st. Halves are raw 16-bit words converted with PTX
// (f16) or bit operations (bf16, round to nearest even, NaN kept quiet), so no CUDA header is
// needed (NVRTC may have no include directory).
inline std::string dtype_prelude(DType d) {
  std::string s = "#define KC_INF __int_as_float(0x7f800000)\n#define KC_NAN __int_as_float(0x7fffffff)\n";
  if (d == DType::kF32)
    return s + R"CU(typedef float T;
__device__ __forceinline__ float ld(T v) { return v; }
__device__ __forceinline__ T st(float v) { return v; }
)CU";
  if (d == DType::kF16)
    return s + R"CU(typedef unsigned short T;
__device__ __forceinline__ float ld(T v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ T st(float f) { T h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
)CU";
  return s + R"CU(typedef unsigned short T;
__device__ __forceinline__ float ld(T v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ T st(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (T)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (T)(u >> 16);
}
)CU";
}

// A pooling kernel's linear work index `it` (of `total`) over [plane][t < TN][h < HN][c < WC]
// split into c, h, t and plane, with row = it / WC and pt = row / HN (the (plane, t) index).
// 32-bit divisions where total fits, as in most calls: a 64-bit division is a long call.
inline constexpr const char* kPoolCoords = R"CU(
__device__ __forceinline__ void kc_coords(long long it, long long total, long long WC, int HN, int TN, long long& row,
                                          long long& pt, long long& plane, int& c, int& h, int& t) {
  if (total <= 0xffffffffll) {
    const unsigned u = (unsigned)it, r = u / (unsigned)WC, r2 = r / (unsigned)HN, r3 = r2 / (unsigned)TN;
    c = (int)(u - r * (unsigned)WC); h = (int)(r - r2 * (unsigned)HN); t = (int)(r2 - r3 * (unsigned)TN);
    row = r; pt = r2; plane = r3;
  } else {
    row = it / WC; pt = row / HN; plane = pt / TN;
    c = (int)(it - row * WC); h = (int)(row - pt * HN); t = (int)(pt - plane * TN);
  }
}
)CU";

// The row of a row kernel's thread: RPB rows a block, groups of G threads (constants of the
// source, as row_consts writes them); see kc_row_of.
inline constexpr const char* kRowOf = R"CU(
// This thread's row of M (RPB rows a block, groups of G threads) and its index t in the group;
// false when its whole warp is past the end. A warp holds 32 / G rows when G < 32 (short rows), so
// a row past the end within it is not `live`: it folds nothing, but its lanes still shuffle.
__device__ __forceinline__ bool kc_row_of(long long M, int& t, long long& row, bool& live) {
  t = G <= 32 ? (int)(threadIdx.x & (G - 1)) : (int)threadIdx.x;
  row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  live = row < M;
  return row - (G < 32 ? (threadIdx.x & 31) / G : 0) < M;   // a block row always exists
}
)CU";

// Reductions over a group of G threads owning one row: G <= 32 is (part of) one warp (xor
// shuffles leave the identical result in every lane of the group; kc_gsum only takes G < 32,
// global pooling's short planes), G > 32 is the whole block (warp shuffles, then every
// thread folds the per-warp values from shared memory in the same order). The trailing barrier
// lets the next reduction reuse the shared array. Welford merges are not symmetric, so they reduce
// down to lane 0 and broadcast.
inline constexpr const char* kGroupHelpers = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
__device__ __forceinline__ float kc_gsum(float v, float* sh) {
#pragma unroll
  for (int o = (G < 32 ? G : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) v += sh[w];
    __syncthreads();
  }
  return v;
}
__device__ __forceinline__ void kc_gsum2(float& a, float& b, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) { sh[threadIdx.x >> 5] = a; sh[32 + (threadIdx.x >> 5)] = b; }
    __syncthreads();
    a = sh[0];
    b = sh[32];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) { a += sh[w]; b += sh[32 + w]; }
    __syncthreads();
  }
}
__device__ __forceinline__ float kc_gmax(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) v = fmaxf(v, sh[w]);
    __syncthreads();
  }
  return v;
}
// Welford / Chan: count n, mean m, sum of squared deviations q.
struct KcW { float n, m, q; };
__device__ __forceinline__ void kc_wadd(KcW& a, float nb, float mb, float qb) {
  if (nb == 0.f) return;
  if (a.n == 0.f) { a.n = nb; a.m = mb; a.q = qb; return; }
  const float nn = a.n + nb;
  const float d = mb - a.m;
  const float f = nb / nn;
  a.m = a.m + d * f;
  a.q = a.q + qb + d * d * a.n * f;
  a.n = nn;
}
__device__ __forceinline__ void kc_gwelford(KcW& a, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float n = __shfl_down_sync(0xffffffffu, a.n, o);
    const float m = __shfl_down_sync(0xffffffffu, a.m, o);
    const float q = __shfl_down_sync(0xffffffffu, a.q, o);
    kc_wadd(a, n, m, q);
  }
  if constexpr (G == 32) {
    a.n = __shfl_sync(0xffffffffu, a.n, 0);
    a.m = __shfl_sync(0xffffffffu, a.m, 0);
    a.q = __shfl_sync(0xffffffffu, a.q, 0);
  } else {
    if ((threadIdx.x & 31) == 0) {
      sh[threadIdx.x >> 5] = a.n; sh[32 + (threadIdx.x >> 5)] = a.m; sh[64 + (threadIdx.x >> 5)] = a.q;
    }
    __syncthreads();
    a.n = sh[0]; a.m = sh[32]; a.q = sh[64];
    for (int w = 1; w < G / 32; ++w) kc_wadd(a, sh[w], sh[32 + w], sh[64 + w]);
    __syncthreads();
  }
}
)CU";

// ---------------------------------------------------------------------------------------------
// Knob plumbing.

// `values` with `first` moved to the front (the default), the rest in their order.
inline std::vector<int64_t> with_default(std::vector<int64_t> values, int64_t first) {
  auto it = std::find(values.begin(), values.end(), first);
  if (it != values.end()) values.erase(it);
  values.insert(values.begin(), first);
  return values;
}

// Blocks per channel of a two-stage per-channel reduction over `totv` vectors a channel, for
// `channels` channels: slices of at least 256 vectors; default the fewest that give ~4 blocks per
// SM (batch norm forward and backward).
inline std::vector<int64_t> channel_block_values(int64_t channels, int64_t totv) {
  std::vector<int64_t> v;
  for (int64_t p = 1; p <= 512 && (p == 1 || totv / p >= 256) && channels * p <= INT_MAX; p *= 2) v.push_back(p);
  int64_t def = v.back();
  for (int64_t p : v)
    if (channels * p >= 4 * kSms) { def = p; break; }
  return with_default(v, def);
}

// Every dimension's value from `k` (its default when absent); values outside a dimension are
// kUnsupported. Names `k` has and the space lacks are ignored.
inline Result<Knobs> pick(const std::vector<KnobDim>& space, const Knobs& k) {
  Knobs out;
  for (const auto& d : space) {
    auto it = k.find(d.name);
    int64_t v = it == k.end() ? d.values.front() : it->second;
    if (std::find(d.values.begin(), d.values.end(), v) == d.values.end())
      return unsupported("knob " + d.name + "=" + S(v) + " is not in this call's space");
    out[d.name] = v;
  }
  return out;
}

// Floats a thread may cache in registers per array: above 512 threads __launch_bounds__ leaves
// 64 registers a thread.
inline int64_t reg_budget(int64_t threads) { return threads >= 1024 ? 16 : 32; }

inline std::vector<int64_t> vec_values(DType d, int64_t row) {
  std::vector<int64_t> v;
  for (int64_t x : {1, 2, 4, 8})
    if ((x <= 4 || d != DType::kF32) && row % x == 0) v.push_back(x);
  return v;
}

// Row templates (softmax, layer norm): a group of `threads` threads owns a row; 32 means one warp
// per row and `rows` warps a block, more means one block per row, fewer (global pooling's short
// planes) 32 / threads rows a warp.
struct RowGeom {
  int64_t g = 32, rpb = 1, vec = 1, items = 0;   // items: vectors a thread caches (0: none)
};

// Default geometry for rows of L elements: the widest vector dividing the row, about 8 vectors
// per thread, 4 rows a block for warp rows; registers when the row fits.
inline void row_space(std::vector<KnobDim>& sp, DType d, int64_t L, bool with_regs) {
  auto vecs = vec_values(d, L);
  int64_t vec = vecs.back();
  int64_t g = std::clamp<int64_t>(pow2_ceil(cdiv(L / vec, 8)), 32, 1024);
  sp.push_back({"threads", with_default({32, 64, 128, 256, 512, 1024}, g)});
  sp.push_back({"rows", with_default({1, 2, 4, 8}, g == 32 ? 4 : 1)});
  sp.push_back({"vec", with_default(vecs, vec)});
  if (with_regs) {
    const int64_t nt = g == 32 ? 128 : g;
    bool fits = pow2_ceil(cdiv(L / vec, g)) * vec <= reg_budget(nt);
    sp.push_back({"regs", fits ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1}});
  }
}

inline Result<RowGeom> row_geom(Knobs& k, int64_t L) {
  RowGeom r;
  r.g = k.at("threads");
  if (r.g > 32) k["rows"] = 1;
  r.rpb = k.at("rows");
  if (r.g < 32) r.rpb *= 32 / r.g;   // `rows` warps of 32 / G rows each (groups under a warp)
  r.vec = k.at("vec");
  if (L % r.vec != 0) return unsupported("vec " + S(r.vec) + " does not divide the row (" + S(L) + ")");
  if (k.count("regs") && k.at("regs")) {
    r.items = pow2_ceil(cdiv(L / r.vec, r.g));
    if (r.items * r.vec > reg_budget(r.g * r.rpb))
      return unsupported("a row of " + S(L) + " does not fit " + S(r.g) + " threads' registers");
  }
  return r;
}

// Row knobs for kernels that read a row twice (a sum, then the outputs): threads / rows / vec /
// regs as row_space, but the default is the fewest threads a row (a warp, or a block of 64 to
// 1024) whose registers hold the row in the widest vectors, so the second pass never touches
// memory; a row too long for any group streams through `stream` threads reading it twice
// (RMSNorm forward and backward).
inline void cached_row_space(std::vector<KnobDim>& sp, DType d, int64_t L, int64_t stream) {
  auto vecs = vec_values(d, L);
  const int64_t vec = vecs.back(), nv = L / vec;
  int64_t g = 0;
  for (int64_t t = 32; t <= 1024 && g == 0; t *= 2)
    if (pow2_ceil(cdiv(nv, t)) * vec <= reg_budget(t == 32 ? 128 : t)) g = t;
  sp.push_back({"threads", with_default({32, 64, 128, 256, 512, 1024}, g ? g : stream)});
  sp.push_back({"rows", with_default({1, 2, 4, 8}, g == 32 ? 4 : 1)});
  sp.push_back({"vec", with_default(vecs, vec)});
  sp.push_back({"regs", g ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1}});
}

// Column-sum knobs (a norm backward's grad_weight / grad_bias over M rows of N): blocks of 32 x
// col_ty threads with col_vec columns a thread over col_split row ranges. Defaults: the widest
// vectors, up to 8 warps a block, and enough ranges for ~2 blocks an SM while each range keeps
// at least `min_rows` rows a warp.
inline void col_space(std::vector<KnobDim>& sp, DType d, int64_t M, int64_t N, int64_t min_rows) {
  auto cvs = vec_values(d, N);
  const int64_t cv = cvs.back();
  int64_t ty = 1;
  while (ty < 8 && ty * 2 <= M) ty *= 2;
  const int64_t colblocks = cdiv(N, 32 * cv);
  int64_t rs = 1;
  while (rs < 256 && colblocks * rs < 2 * kSms && (rs * 2) * ty * min_rows <= M) rs *= 2;
  sp.push_back({"col_ty", with_default({1, 2, 4, 8, 16, 32}, ty)});
  sp.push_back({"col_vec", with_default(cvs, cv)});
  sp.push_back({"col_split", with_default({1, 2, 4, 8, 16, 32, 64, 128, 256}, rs)});
}

inline std::string row_consts(const RowGeom& r) {
  return "constexpr int G = " + S(r.g) + ", RPB = " + S(r.rpb) + ", NT = G * RPB, VEC = " + S(r.vec) +
         ", ITEMS = " + S(r.items) + ";\n";
}

inline std::string row_grid(const RowGeom& r, const std::string& rows) {
  return r.g <= 32 ? "ceil_div(" + rows + ", " + S(r.rpb) + ")" : rows;   // groups of a warp or less
}

inline json launch(const std::string& entry, const std::vector<json>& grid, const std::vector<json>& block,
            const std::vector<std::string>& args) {
  json l = json::object();
  l["entry"] = entry;
  l["grid"] = json(grid);
  l["block"] = json(block);
  l["smem"] = 0;
  l["args"] = args;
  return l;
}

inline Candidate make_candidate(const char* family, Knobs k, std::string src, json launches, json scratch = nullptr) {
  Candidate c;
  c.family = family;
  c.knobs = std::move(k);
  c.source = std::move(src);
  c.launch = {{"version", 1}, {"launches", std::move(launches)}};
  if (!scratch.is_null()) c.launch["scratch"] = std::move(scratch);
  return c;
}

inline bool tensor_ok(const TensorMeta* t, DType d) { return t && t->defined && t->dtype == d; }

// The device type of an element of d (f32, or a raw 16-bit word for halves; dtype_prelude).
inline const char* ctype(DType d) { return d == DType::kF32 ? "float" : "unsigned short"; }

// Per-channel affine parameters (group and batch norm): their element type PT (the input's or
// fp32) with ldp(), HAS_W / HAS_B, and KC_WB_PARAMS / KC_WB_LOCALS, the kernel parameters of the
// present ones and nullptr locals for the absent (a launch spec may only name present tensors).
inline std::string affine_prelude(DType p, bool has_w, bool has_b) {
  std::string s = std::string("typedef ") + ctype(p) + " PT;\n";
  s += p == DType::kF32 ? "__device__ __forceinline__ float ldp(PT v) { return v; }\n"
                        : "__device__ __forceinline__ float ldp(PT v) { return ld(v); }\n";
  s += std::string("constexpr bool HAS_W = ") + (has_w ? "true" : "false") + ", HAS_B = " + (has_b ? "true" : "false") + ";\n";
  std::string params = "#define KC_WB_PARAMS", locals = "#define KC_WB_LOCALS";
  for (const auto& [n, on] : {std::pair<const char*, bool>{"w", has_w}, {"b", has_b}}) {
    if (on) params += std::string(" , const PT* __restrict__ ") + n;
    else locals += std::string(" const PT* ") + n + " = nullptr; (void)" + n + ";";
  }
  return s + params + "\n" + locals + "\n";
}

// stp(): a float stored as the parameter type PT (affine_prelude), for parameter gradients.
inline std::string param_store(DType p) {
  return p == DType::kF32 ? "__device__ __forceinline__ float stp(float v) { return v; }\n"
                          : "__device__ __forceinline__ PT stp(float v) { return st(v); }\n";
}

// The optional parameter gradients (batch and group norm backward): GW / GB and KC_G_PARAMS /
// KC_G_LOCALS, outputs gw and gb of type PT for the requested ones, nullptr locals for the others.
inline std::string grad_wb_params(bool gw, bool gb) {
  std::string s = std::string("constexpr bool GW = ") + (gw ? "true" : "false") + ", GB = " + (gb ? "true" : "false") + ";\n";
  std::string params = "#define KC_G_PARAMS", locals = "#define KC_G_LOCALS";
  for (const auto& [n, on] : {std::pair<const char*, bool>{"gw", gw}, {"gb", gb}}) {
    if (on) params += std::string(" , PT* __restrict__ ") + n;
    else locals += std::string(" PT* ") + n + " = nullptr; (void)" + n + ";";
  }
  return s + params + "\n" + locals + "\n";
}

}  // namespace kc::evolve::cuda_tpl
