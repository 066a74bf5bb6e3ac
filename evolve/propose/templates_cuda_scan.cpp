// CUDA scan template (cuda.scan): cumsum, cumprod and logcumsumexp along one axis.
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h.
//
// The input is viewed as [outer, L, inner] with L = size(dim) and inner the product of the sizes
// after dim (stride(out0, dim): outputs are always dense with canonical strides). Two layouts:
//  - rows (inner == 1): a group (warp or block) scans a row tile by tile with a running carry.
//    split = S > 0 cuts every row into S chunks over S blocks: launch 1 writes each chunk's total
//    into scratch, launch 2 has each block fold the totals of the chunks before it (fixed order,
//    so the result is deterministic) and rescan its chunk from that carry.
//  - cols (inner > 1): a thread owns VEC adjacent columns (coalesced across the warp) and walks
//    along L; split = S > 0 cuts L into S chunks the same two-launch way.
// Math and carries are fp32; the output is rounded once per element. Sizes reach the kernels as
// arguments, so a source depends only on op, dtype and knobs.
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// The combine of each op, with an identity ID such that kc_comb(ID, x) == x bit for bit (-0 for
// sums keeps a lone -0 input; 1 for products; -inf for log-add-exp). All three are commutative in
// floating point, which the xor-butterfly reductions rely on.
const char* kCombSum = R"CU(#define ID (-0.f)
__device__ __forceinline__ float kc_comb(float a, float b) { return a + b; }
)CU";
const char* kCombProd = R"CU(#define ID 1.f
__device__ __forceinline__ float kc_comb(float a, float b) { return a * b; }
)CU";
// log(exp(a) + exp(b)) as eager computes it: NaN wins, equal infinities stay themselves (so an
// all -inf prefix stays -inf and +inf stays +inf), otherwise max + log1p(exp(min - max)).
const char* kCombLse = R"CU(#define ID (-KC_INF)
__device__ __forceinline__ float kc_comb(float a, float b) {
  if (a != a || b != b) return a + b;
  const float mx = fmaxf(a, b), mn = fminf(a, b);
  if (mn == mx && (mx == KC_INF || mx == -KC_INF)) return mx;
  return mx + log1pf(expf(mn - mx));
}
)CU";

// Group helpers over G threads (G == 32: each warp is its own group; G > 32: the whole block).
// kc_gred: the group's fold, identical in every thread. kc_gscan: the exclusive prefix of `v` over
// the group's threads in thread order, and the group's total in every thread. Both end with a
// barrier (G > 32) so the shared array can be reused.
const char* kScanGroup = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
__device__ __forceinline__ float kc_gred(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = kc_comb(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
    for (int w = 1; w < G / 32; ++w) v = kc_comb(v, sh[w]);
    __syncthreads();
  }
  return v;
}
__device__ __forceinline__ float kc_gscan(float v, float* sh, float& total) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = kc_comb(y, v);
  }
  float ex = __shfl_up_sync(0xffffffffu, v, 1);
  if (lane == 0) ex = ID;
  if constexpr (G == 32) {
    total = __shfl_sync(0xffffffffu, v, 31);
    return ex;
  } else {
    const int w = threadIdx.x >> 5;
    if (lane == 31) sh[w] = v;
    __syncthreads();
    if (w == 0) {
      float s = lane < G / 32 ? sh[lane] : ID;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s = kc_comb(y, s);
      }
      if (lane < G / 32) sh[lane] = s;
    }
    __syncthreads();
    total = sh[G / 32 - 1];
    if (w > 0) ex = kc_comb(sh[w - 1], ex);
    __syncthreads();
    return ex;
  }
}
)CU";

// Rows: a group scans elements [lo, hi) of one row from `carry`. A tile is G * ITEMS vectors;
// thread t owns ITEMS consecutive vectors of it, scans them locally, and the group scan of the
// threads' totals gives each thread its offset. lo and hi are multiples of VEC except hi == L.
const char* kRowsBody = R"CU(
__device__ __forceinline__ void kc_scan_seg(T* __restrict__ out, const T* __restrict__ x, long long lo, long long hi,
                                            float carry, int t, float* sh) {
  constexpr int TILE = G * ITEMS * VEC;
  for (long long base = lo; base < hi; base += TILE) {
    float r[ITEMS * VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const long long e0 = base + ((long long)t * ITEMS + k) * VEC;
      if (e0 < hi) {
        const V v = *reinterpret_cast<const V*>(x + e0);
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[k * VEC + e] = ld(v.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[k * VEC + e] = ID;
      }
    }
#pragma unroll
    for (int i = 1; i < ITEMS * VEC; ++i) r[i] = kc_comb(r[i - 1], r[i]);
    float total;
    const float p = kc_comb(carry, kc_gscan(r[ITEMS * VEC - 1], sh, total));
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const long long e0 = base + ((long long)t * ITEMS + k) * VEC;
      if (e0 < hi) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_comb(p, r[k * VEC + e]));
        *reinterpret_cast<V*>(out + e0) = o;
      }
    }
    carry = kc_comb(carry, total);
  }
}
__device__ __forceinline__ long long kc_chunk(long long L, int S) { return ((L + S - 1) / S + VEC - 1) / VEC * VEC; }

extern "C" __global__ void __launch_bounds__(NT) kc_scan_rows(T* __restrict__ out, const T* __restrict__ x,
                                                              long long rows, long long L) {
  __shared__ float sh[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  kc_scan_seg(out + row * L, x + row * L, 0, L, ID, t, sh);
}

// Split rows, launch 1: one block per chunk writes the chunk's total.
extern "C" __global__ void __launch_bounds__(NT) kc_scan_rows_part(float* __restrict__ part, const T* __restrict__ x,
                                                                   long long rows, long long L, int S) {
  __shared__ float sh[32];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(L, S), lo = c * C, hi = min(L, lo + C);
  const V* xv = reinterpret_cast<const V*>(x + row * L);
  float a = ID;
  for (long long i = lo / VEC + threadIdx.x; i * VEC < hi; i += NT) {
    const V v = xv[i];
#pragma unroll
    for (int e = 0; e < VEC; ++e) a = kc_comb(a, ld(v.v[e]));
  }
  a = kc_gred(a, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = a;
}

// Split rows, launch 2: fold the totals of the chunks before this one, then rescan the chunk.
extern "C" __global__ void __launch_bounds__(NT) kc_scan_rows_apply(T* __restrict__ out, const T* __restrict__ x,
    const float* __restrict__ part, long long rows, long long L, int S) {
  __shared__ float sh[32];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(L, S), lo = c * C, hi = min(L, lo + C);
  float a = ID;
  for (int p = threadIdx.x; p < c; p += NT) a = kc_comb(a, part[row * S + p]);
  const float carry = kc_gred(a, sh);
  kc_scan_seg(out + row * L, x + row * L, lo, hi, carry, threadIdx.x, sh);
}
)CU";

// Cols: thread j of column tile `tile` owns columns [(tile * NT + j) * VEC, + VEC) of one outer
// slice and walks rows [lo, hi) of L, UNROLL rows of loads in flight. Chunk c of S covers rows
// [c * ceil(L / S), ...). Block index = (o * S + c) * tiles + tile.
const char* kColsBody = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
struct kc_cpos { long long o, col, lo, hi; int c; bool ok; };
__device__ __forceinline__ kc_cpos kc_cols_pos(long long outer, long long L, long long inner, int S) {
  const long long tiles = (inner + NT * VEC - 1) / (NT * VEC);
  const long long b = blockIdx.x, tile = b % tiles, oc = b / tiles;
  kc_cpos p;
  p.c = (int)(oc % S);
  p.o = oc / S;
  p.col = (tile * NT + threadIdx.x) * VEC;
  const long long C = (L + S - 1) / S;
  p.lo = p.c * C;
  p.hi = min(L, p.lo + C);
  p.ok = p.col < inner && p.o < outer;
  return p;
}
__device__ __forceinline__ void kc_cols_seg(T* __restrict__ out, const T* __restrict__ x, const kc_cpos& p,
                                            long long L, long long inner, float* a) {
  const long long base = p.o * L * inner + p.col;
  for (long long l = p.lo; l < p.hi; l += UNROLL) {
    V v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (l + u < p.hi) v[u] = *reinterpret_cast<const V*>(x + base + (l + u) * inner);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (l + u < p.hi) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(a[e] = kc_comb(a[e], ld(v[u].v[e])));
        *reinterpret_cast<V*>(out + base + (l + u) * inner) = o;
      }
  }
}

extern "C" __global__ void __launch_bounds__(NT) kc_scan_cols(T* __restrict__ out, const T* __restrict__ x,
                                                              long long outer, long long L, long long inner) {
  const kc_cpos p = kc_cols_pos(outer, L, inner, 1);
  if (!p.ok) return;
  float a[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) a[e] = ID;
  kc_cols_seg(out, x, p, L, inner, a);
}

// Split cols, launch 1: each thread's fold of its columns over its chunk, at part[(o*S + c)*inner + col].
extern "C" __global__ void __launch_bounds__(NT) kc_scan_cols_part(float* __restrict__ part, const T* __restrict__ x,
    long long outer, long long L, long long inner, int S) {
  const kc_cpos p = kc_cols_pos(outer, L, inner, S);
  if (!p.ok) return;
  float a[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) a[e] = ID;
  const long long base = p.o * L * inner + p.col;
  for (long long l = p.lo; l < p.hi; l += UNROLL) {
    V v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (l + u < p.hi) v[u] = *reinterpret_cast<const V*>(x + base + (l + u) * inner);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (l + u < p.hi)
#pragma unroll
        for (int e = 0; e < VEC; ++e) a[e] = kc_comb(a[e], ld(v[u].v[e]));
  }
  float* pp = part + (p.o * S + p.c) * inner + p.col;
#pragma unroll
  for (int e = 0; e < VEC; ++e) pp[e] = a[e];
}

// Split cols, launch 2: fold the chunks before this one (in chunk order), then rescan.
extern "C" __global__ void __launch_bounds__(NT) kc_scan_cols_apply(T* __restrict__ out, const T* __restrict__ x,
    const float* __restrict__ part, long long outer, long long L, long long inner, int S) {
  const kc_cpos p = kc_cols_pos(outer, L, inner, S);
  if (!p.ok) return;
  float a[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) a[e] = ID;
  const float* pp = part + p.o * S * inner + p.col;
  for (int c = 0; c < p.c; ++c)
#pragma unroll
    for (int e = 0; e < VEC; ++e) a[e] = kc_comb(a[e], pp[c * inner + e]);
  kc_cols_seg(out, x, p, L, inner, a);
}
)CU";

// Chunk counts worth trying; `min_chunk` elements (rows) per chunk at least.
std::vector<int64_t> scan_splits(int64_t lines, int64_t L, int64_t min_chunk, int64_t max_split) {
  std::vector<int64_t> v = {0};
  for (int64_t s : {2, 4, 8, 16, 32, 64, 128, 256})
    if (s <= max_split && L / s >= min_chunk && lines * s <= INT_MAX / 2) v.push_back(s);
  return v;
}

// The smallest split giving at least `want` blocks (0 when `blocks` already does).
int64_t split_default(const std::vector<int64_t>& v, int64_t blocks, int64_t want) {
  if (blocks >= want) return 0;
  for (int64_t s : v)
    if (s > 0 && blocks * s >= want) return s;
  return v.back();
}

struct ScanShape {
  DType dt = DType::kF32;
  int64_t outer = 0, L = 0, inner = 0;
};

class ScanTemplate : public Template {
 public:
  const char* name() const override { return "cuda.scan"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    ScanShape s;
    if (!handles(c, s)) return {};
    std::vector<KnobDim> sp;
    if (s.inner == 1) rows_space(sp, s);
    else cols_space(sp, s);
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    ScanShape s;
    if (!handles(c, s)) return unsupported("cuda.scan does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const char* comb = c.op == OpId::kCumsum ? kCombSum : c.op == OpId::kCumprod ? kCombProd : kCombLse;
    const std::string head = "// kernelcraft cuda.scan " + std::string(op_info(c.op).name) + " " +
                             dtype_name(s.dt) + "\n" + dtype_prelude(s.dt) + comb;
    return s.inner == 1 ? render_rows(s, std::move(k), head) : render_cols(s, std::move(k), head);
  }

 private:
  // Dense f32/bf16/f16 input, output of the same sizes and dtype ("dtype" none or the input's).
  static bool handles(const OpCall& c, ScanShape& s) {
    if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kScan) return false;
    if (!c.dense() || c.outputs.size() != 1) return false;
    const TensorMeta* x = c.input("self");
    if (!x || !x->defined || !elem_dtype(x->dtype) || x->sizes.empty() || x->numel() == 0) return false;
    const std::string want = c.string_arg("dtype", "none");
    if (want != "none" && want != dtype_name(x->dtype)) return false;
    const TensorMeta& o = c.outputs[0];
    if (!o.defined || o.dtype != x->dtype || o.sizes != x->sizes || o.strides.size() != x->sizes.size()) return false;
    const int64_t nd = static_cast<int64_t>(x->sizes.size());
    int64_t dim = c.int_arg("dim", -1);
    if (dim < 0) dim += nd;
    if (dim < 0 || dim >= nd) return false;
    s.dt = x->dtype;
    s.L = x->sizes[dim];
    s.inner = 1;
    for (int64_t i = dim + 1; i < nd; ++i) s.inner *= x->sizes[i];
    if (o.strides[dim] != s.inner) return false;   // the launch spec reads inner as stride(out0, dim)
    s.outer = x->numel() / (s.L * s.inner);
    return x->numel() < (int64_t{1} << 40);
  }

  static void rows_space(std::vector<KnobDim>& sp, const ScanShape& s) {
    auto vecs = vec_values(s.dt, s.L);
    const int64_t vec = vecs.back();
    const int64_t g = std::clamp<int64_t>(pow2_ceil(cdiv(s.L, vec * 2)), 32, 256);
    sp.push_back({"threads", with_default({32, 64, 128, 256, 512, 1024}, g)});
    sp.push_back({"rows", with_default({1, 2, 4, 8}, g == 32 ? 4 : 1)});
    sp.push_back({"vec", with_default(vecs, vec)});
    sp.push_back({"items", {2, 1, 4, 8}});
    auto splits = scan_splits(s.outer, s.L, 4096, 256);
    sp.push_back({"split", with_default(splits, split_default(splits, s.outer, 4 * kSms))});
  }

  static void cols_space(std::vector<KnobDim>& sp, const ScanShape& s) {
    // At most sqrt(L) chunks, so folding the chunk totals costs no more than the chunk's own walk.
    int64_t max_split = 1;
    while ((max_split * 2) * (max_split * 2) <= s.L) max_split *= 2;
    // The widest vector (up to 4) that still leaves enough threads to fill the GPU (about 1024 a
    // multiprocessor) once L is split; narrow columns otherwise.
    auto vecs = vec_values(s.dt, s.inner);
    int64_t vec = 1;
    for (int64_t v : vecs)
      if (v <= 4 && (v == 1 || s.outer * (s.inner / v) * max_split >= 1024 * kSms)) vec = v;
    const int64_t nt = std::clamp<int64_t>(pow2_ceil(cdiv(s.inner, vec)), 32, 128);
    sp.push_back({"threads", with_default({32, 64, 128, 256, 512}, nt)});
    sp.push_back({"vec", with_default(vecs, vec)});
    sp.push_back({"unroll", {4, 1, 2, 8}});
    const int64_t lines = s.outer * cdiv(s.inner, nt * vec);
    auto splits = scan_splits(lines, s.L, 8, max_split);
    sp.push_back({"split", with_default(splits, split_default(splits, lines * nt, 1024 * kSms))});
  }

  Result<Candidate> render_rows(const ScanShape& s, Knobs k, const std::string& head) const {
    const int64_t split = k.at("split");
    if (split > 0) k["rows"] = 1;   // the split kernels run one block per chunk
    auto gr = row_geom(k, s.L);
    if (!gr.is_ok()) return gr.status();
    RowGeom r = gr.value();
    const int64_t items = k.at("items");
    if (items * r.vec > 16) return unsupported("items x vec above 16 floats a thread");
    // ITEMS here is the vectors a thread owns per tile (not row_consts' register cache).
    const std::string src = head + "constexpr int G = " + S(r.g) + ", RPB = " + S(r.rpb) + ", NT = G * RPB, VEC = " +
                            S(r.vec) + ", ITEMS = " + S(items) + ";\n" + kScanGroup + kRowsBody;
    const std::string rows = "numel(self) / size(self, dim)", L = "size(self, dim)";
    json ls = json::array();
    json scratch = nullptr;
    if (split == 0) {
      if (cdiv(s.outer, r.rpb) > INT_MAX) return unsupported("too many rows for one grid");
      ls.push_back(launch("kc_scan_rows", {row_grid(r, rows)}, {r.g * r.rpb},
                          {"ptr:out0", "ptr:self", "i64:" + rows, "i64:" + L}));
    } else {
      const std::string blocks = rows + " * " + S(split);
      ls.push_back(launch("kc_scan_rows_part", {blocks}, {r.g},
                          {"ptr:part", "ptr:self", "i64:" + rows, "i64:" + L, "i32:" + S(split)}));
      ls.push_back(launch("kc_scan_rows_apply", {blocks}, {r.g},
                          {"ptr:out0", "ptr:self", "ptr:part", "i64:" + rows, "i64:" + L, "i32:" + S(split)}));
      scratch = json::array({{{"name", "part"}, {"bytes", blocks + " * 4"}}});
    }
    return make_candidate(name(), std::move(k), src, std::move(ls), std::move(scratch));
  }

  Result<Candidate> render_cols(const ScanShape& s, Knobs k, const std::string& head) const {
    const int64_t nt = k.at("threads"), vec = k.at("vec"), unroll = k.at("unroll"), split = k.at("split");
    if (s.inner % vec != 0) return unsupported("vec " + S(vec) + " does not divide inner (" + S(s.inner) + ")");
    if (unroll * vec > 16) return unsupported("unroll x vec above 16 vectors of loads a thread");
    const int64_t S_ = std::max<int64_t>(split, 1);
    if (s.outer * S_ * cdiv(s.inner, nt * vec) > INT_MAX) return unsupported("too many blocks for one grid");
    const std::string src = head + "constexpr int NT = " + S(nt) + ", VEC = " + S(vec) + ", UNROLL = " + S(unroll) +
                            ";\n" + kColsBody;
    const std::string L = "size(self, dim)", inner = "stride(out0, dim)";
    const std::string outer = "numel(self) / (" + L + " * " + inner + ")";
    const std::string tiles = "ceil_div(" + inner + ", " + S(nt * vec) + ")";
    const std::vector<std::string> sizes = {"i64:" + outer, "i64:" + L, "i64:" + inner};
    json ls = json::array();
    json scratch = nullptr;
    if (split == 0) {
      std::vector<std::string> a = {"ptr:out0", "ptr:self"};
      a.insert(a.end(), sizes.begin(), sizes.end());
      ls.push_back(launch("kc_scan_cols", {outer + " * " + tiles}, {nt}, a));
    } else {
      const std::string blocks = outer + " * " + S(split) + " * " + tiles;
      std::vector<std::string> p = {"ptr:part", "ptr:self"}, a = {"ptr:out0", "ptr:self", "ptr:part"};
      for (auto* v : {&p, &a}) {
        v->insert(v->end(), sizes.begin(), sizes.end());
        v->push_back("i32:" + S(split));
      }
      ls.push_back(launch("kc_scan_cols_part", {blocks}, {nt}, p));
      ls.push_back(launch("kc_scan_cols_apply", {blocks}, {nt}, a));
      scratch = json::array({{{"name", "part"}, {"bytes", "numel(self) / " + L + " * " + S(split) + " * 4"}}});
    }
    return make_candidate(name(), std::move(k), src, std::move(ls), std::move(scratch));
  }
};

}  // namespace

const Template* cuda_scan_template() {
  static const ScanTemplate t;
  return &t;
}

}  // namespace kc::evolve
