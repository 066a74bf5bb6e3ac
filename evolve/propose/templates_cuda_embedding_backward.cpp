// CUDA embedding backward template (cuda.embedding_backward): embedding_dense_backward, dense
// grad_output [n, D] (indices of any shape, n = numel(indices)) in f32 / bf16 / f16, int64 or
// int32 indices, fp32 accumulation. Part of the CUDA op-family templates; shared pieces in
// templates_cuda_common.h.
//
// Deterministic without float atomics: every output row sums its grad rows in one order fixed by
// the input (ascending positions), whatever the scheduling, because the positions are sorted first:
//   1. a stable LSD radix sort of (key, position) pairs, 8 bits a pass, P = ceil(bits(W) / 8)
//      passes (two for GPT-2's 50257 rows), the key being the index, or W for padding_idx and
//      indices outside [0, W) (they sort last and reach no row). Per pass: kc_ebw_hist (each block
//      of NTS positions counts its digits: integer atomics in shared memory, exact), kc_ebw_scan
//      (one block: exclusive scan of the [digit][block] counts) and kc_ebw_scatter (each key to
//      its digit's place; inside a block warps go in order and lanes by __match_any_sync rank, so
//      equal digits keep their order: stable);
//   2. kc_ebw_bounds: start[w] = the first sorted slot whose key is >= w, for w in [0, W], each
//      written exactly once, by the thread of the slot after the gap holding w (a thread writes
//      its whole gap: cheap while n is not far below W, serial for a few positions into a huge
//      table);
//   3. the sums, VEC-wide loads across D, ITEMS vectors a lane per pass over the slots, RPB warps
//      a block, fp32 accumulation; scale_grad_by_freq divides a row's sum by its count once;
//      rows no position reaches (padding_idx among them) are written as zeros:
//      chunk = 0: kc_ebw_sum, a warp per output row over its slots in order. Simple, but a hot
//        row (a frequent token: thousands of positions) is one warp's serial work;
//      chunk = CH: kc_ebw_seg, a warp per CH sorted slots summing each run of one row, then
//        kc_ebw_fix, a warp per row adding the partials of a row that spans chunks in chunk
//        order (serial depth CH + count / CH instead of count).
//      Either way every output element has one fixed order of additions: bitwise repeatable.
// Knobs: sort_threads (NTS, positions a sort block), chunk, rows (RPB), vec, items; and `atomic`
// (fp32 only): no sort, float atomics (2: a vector an atomic), not bitwise repeatable (templates_cuda_embedding_backward_atomic.cpp), seeded in the
// first generation so the search times it against the sort.
// Scratch: the [digit][block] counts, two (key, position) buffers (ping-pong), start, and for
// chunk > 0 two fp32 partial rows a chunk.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_embedding_backward.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kEbwBody = R"CU(
constexpr int RADIX = 256, NWS = NTS / 32;
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };

// The sort key of position i: its index, or W where no row receives it.
__device__ __forceinline__ int kc_key(const IT* idx, long long i, long long W, long long pad) {
  const long long v = (long long)idx[i];
  return (v < 0 || v >= W || v == pad) ? (int)W : (int)v;
}

extern "C" __global__ void __launch_bounds__(NTS) kc_ebw_hist(int* __restrict__ hist, const IT* __restrict__ idx,
    const int* __restrict__ kin, int n, long long W, long long pad, int shift, int nb, int first) {
  __shared__ int h[RADIX];
  for (int d = threadIdx.x; d < RADIX; d += NTS) h[d] = 0;
  __syncthreads();
  const long long i = (long long)blockIdx.x * NTS + threadIdx.x;
  if (i < n) atomicAdd(&h[((first ? kc_key(idx, i, W, pad) : kin[i]) >> shift) & (RADIX - 1)], 1);
  __syncthreads();
  for (int d = threadIdx.x; d < RADIX; d += NTS) hist[(long long)d * nb + blockIdx.x] = h[d];
}

// Exclusive scan of a[0, len) in place by one block of 1024 threads, tiles of 8 a thread.
extern "C" __global__ void __launch_bounds__(1024) kc_ebw_scan(int* __restrict__ a, int len) {
  __shared__ int ws[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int carry = 0;
  for (long long base = 0; base < len; base += 1024 * 8) {
    const long long t0 = base + threadIdx.x * 8;
    int v[8], s = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) { v[e] = t0 + e < len ? a[t0 + e] : 0; s += v[e]; }
    int x = s;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) { const int y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }
    if (lane == 31) ws[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int w = ws[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) { const int y = __shfl_up_sync(0xffffffffu, w, o); if (lane >= o) w += y; }
      ws[lane] = w;
    }
    __syncthreads();
    int run = carry + (warp ? ws[warp - 1] : 0) + x - s;
#pragma unroll
    for (int e = 0; e < 8; ++e) if (t0 + e < len) { a[t0 + e] = run; run += v[e]; }
    carry += ws[31];
    __syncthreads();   // ws is rewritten by the next tile
  }
}

// One stable counting pass: block b's keys go to hist[digit][b] (scanned) plus their rank among
// the block's earlier keys of the same digit (earlier warps, then earlier lanes).
extern "C" __global__ void __launch_bounds__(NTS) kc_ebw_scatter(int* __restrict__ kout, int* __restrict__ vout,
    const IT* __restrict__ idx, const int* __restrict__ kin, const int* __restrict__ vin, const int* __restrict__ hist,
    int n, long long W, long long pad, int shift, int nb, int first) {
  __shared__ int wc[NWS][RADIX];
  for (int j = threadIdx.x; j < NWS * RADIX; j += NTS) wc[j / RADIX][j % RADIX] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long i = (long long)blockIdx.x * NTS + threadIdx.x;
  const bool live = i < n;
  int k = 0, v = 0, d = RADIX;   // a dead lane's digit matches no live one
  if (live) {
    k = first ? kc_key(idx, i, W, pad) : kin[i];
    v = first ? (int)i : vin[i];
    d = (k >> shift) & (RADIX - 1);
  }
  const unsigned peers = __match_any_sync(0xffffffffu, d);
  const int before = __popc(peers & ((1u << lane) - 1u));
  if (live && before == 0) wc[warp][d] = __popc(peers);
  __syncthreads();
  for (int dd = threadIdx.x; dd < RADIX; dd += NTS) {
    int run = hist[(long long)dd * nb + blockIdx.x];
    for (int w = 0; w < NWS; ++w) { const int t = wc[w][dd]; wc[w][dd] = run; run += t; }
  }
  __syncthreads();
  if (live) {
    const int dst = wc[warp][d] + before;
    kout[dst] = k;
    vout[dst] = v;
  }
}

// Slot k in [0, n] starts every row in (keys[k - 1], keys[k]] (keys[-1] = -1, keys[n] = W).
extern "C" __global__ void __launch_bounds__(256) kc_ebw_bounds(int* __restrict__ start, const int* __restrict__ keys,
    int n, int W) {
  const long long k = (long long)blockIdx.x * 256 + threadIdx.x;
  if (k > n) return;
  const int prev = k == 0 ? -1 : keys[k - 1], cur = k == n ? W : keys[k];
  for (int w = prev + 1; w <= cur; ++w) start[w] = (int)k;
}

// Adds grad row p's vectors [c0, c0 + 32 ITEMS) (this lane's) into acc, and stores acc.
__device__ __forceinline__ void kc_add_row(float (&acc)[ITEMS][VEC], const T* __restrict__ g, long long p, long long c0,
                                           long long DV) {
  const V* row = reinterpret_cast<const V*>(g) + p * DV;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const long long col = c0 + it * 32 + lane;
    if (col < DV) {
      const V x = row[col];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[it][e] += ld(x.v[e]);
    }
  }
}
__device__ __forceinline__ void kc_zero(float (&acc)[ITEMS][VEC]) {
#pragma unroll
  for (int it = 0; it < ITEMS; ++it)
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[it][e] = 0.f;
}
// Output row w's vectors from acc, divided by the row's count under scale_grad_by_freq.
__device__ __forceinline__ void kc_store_row(T* __restrict__ out, long long w, const float (&acc)[ITEMS][VEC], int count,
                                             long long c0, long long DV) {
  V* ov = reinterpret_cast<V*>(out) + w * DV;
  const int lane = threadIdx.x & 31;
  const float cnt = (float)count;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const long long col = c0 + it * 32 + lane;
    if (col < DV) {
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(SCALE && count > 0 ? acc[it][e] / cnt : acc[it][e]);
      ov[col] = o;
    }
  }
}
// 16 bytes at most: scratch may start only 16-byte aligned (the sanitizer runner places it so).
struct alignas(4 * VEC > 16 ? 16 : 4 * VEC) VF { float v[VEC]; };

#if CH == 0
// A warp per row: the grad rows of slots [start[w], start[w + 1]) in slot (= position) order.
extern "C" __global__ void __launch_bounds__(32 * RPB) kc_ebw_sum(T* __restrict__ out, const T* __restrict__ g,
    const int* __restrict__ pos, const int* __restrict__ start, int W, long long DV) {
  const int lane = threadIdx.x & 31;
  const long long w = (long long)blockIdx.x * RPB + (threadIdx.x >> 5);
  if (w >= W) return;   // whole warps: a warp owns one row
  const int lo = start[w], hi = start[w + 1];
  for (long long c0 = 0; c0 < DV; c0 += 32 * ITEMS) {
    float acc[ITEMS][VEC];
    kc_zero(acc);
    for (int kb = lo; kb < hi; kb += 32) {
      const int mine = kb + lane < hi ? pos[kb + lane] : 0, m = min(32, hi - kb);
#pragma unroll 4
      for (int j = 0; j < m; ++j) kc_add_row(acc, g, __shfl_sync(0xffffffffu, mine, j), c0, DV);
    }
    kc_store_row(out, w, acc, hi - lo, c0, DV);
  }
}
#else
// A warp per chunk q of CH sorted slots sums each run of equal keys in slot order. A run wholly
// inside the chunk is its row's answer; one whose row began in an earlier chunk is the chunk's
// head partial (part[2q]), one whose row goes on into the next chunk its tail partial
// (part[2q + 1]); kc_ebw_fix adds a row's partials in chunk order. A hot row is so spread over
// many warps, and every sum has one fixed order.
extern "C" __global__ void __launch_bounds__(32 * RPB) kc_ebw_seg(T* __restrict__ out, float* __restrict__ part,
    const T* __restrict__ g, const int* __restrict__ keys, const int* __restrict__ pos, const int* __restrict__ start,
    int n, int W, long long DV) {
  const int lane = threadIdx.x & 31;
  const long long q = (long long)blockIdx.x * RPB + (threadIdx.x >> 5);
  const long long s0 = q * CH;
  if (s0 >= n) return;   // whole warps
  const int s1 = (int)min((long long)n, s0 + CH);
  for (long long c0 = 0; c0 < DV; c0 += 32 * ITEMS) {
    float acc[ITEMS][VEC];
    kc_zero(acc);
    int cur = keys[s0];
    auto flush = [&] {   // the run of row cur ending here
      if (cur >= W) return;
      const int lo = start[cur], hi = start[cur + 1];
      const bool before = lo < s0, after = hi > s1;
      if (!before && !after) { kc_store_row(out, cur, acc, hi - lo, c0, DV); return; }
      VF* pv = reinterpret_cast<VF*>(part) + (2 * q + (before ? 0 : 1)) * DV;
#pragma unroll
      for (int it = 0; it < ITEMS; ++it) {
        const long long col = c0 + it * 32 + lane;
        if (col < DV) {
          VF o;
#pragma unroll
          for (int e = 0; e < VEC; ++e) o.v[e] = acc[it][e];
          pv[col] = o;
        }
      }
    };
    for (int tb = (int)s0; tb < s1 && cur < W; tb += 32) {
      const int mk = tb + lane < s1 ? keys[tb + lane] : W, mp = tb + lane < s1 ? pos[tb + lane] : 0;
      const int m = min(32, s1 - tb);
      for (int j = 0; j < m; ++j) {
        const int k = __shfl_sync(0xffffffffu, mk, j), p = __shfl_sync(0xffffffffu, mp, j);
        if (k != cur) {
          flush();
          kc_zero(acc);
          cur = k;
        }
        if (cur >= W) break;   // the sorted tail: padding and out-of-range positions
        kc_add_row(acc, g, p, c0, DV);
      }
    }
    flush();
  }
}

// A warp per row: rows nothing reaches are zeros; a row over several chunks is its first chunk's
// tail partial plus the head partials of the next ones, in chunk order; the others kc_ebw_seg wrote.
extern "C" __global__ void __launch_bounds__(32 * RPB) kc_ebw_fix(T* __restrict__ out, const float* __restrict__ part,
    const int* __restrict__ start, int W, long long DV) {
  const int lane = threadIdx.x & 31;
  const long long w = (long long)blockIdx.x * RPB + (threadIdx.x >> 5);
  if (w >= W) return;
  const int lo = start[w], hi = start[w + 1];
  if (hi > lo && lo / CH == (hi - 1) / CH) return;
  const VF* pv = reinterpret_cast<const VF*>(part);
  for (long long c0 = 0; c0 < DV; c0 += 32 * ITEMS) {
    float acc[ITEMS][VEC];
    kc_zero(acc);
    if (hi > lo) {
      const long long qa = lo / CH, qb = (hi - 1) / CH;
#pragma unroll 4
      for (long long q = qa; q <= qb; ++q) {
        const VF* row = pv + (2 * q + (q == qa ? 1 : 0)) * DV;
#pragma unroll
        for (int it = 0; it < ITEMS; ++it) {
          const long long col = c0 + it * 32 + lane;
          if (col < DV) {
            const VF x = row[col];
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[it][e] += x.v[e];
          }
        }
      }
    }
    kc_store_row(out, w, acc, hi - lo, c0, DV);
  }
}
#endif
)CU";

struct EbwGeom {
  int64_t n = 0, w = 0, d = 0;
  DType g = DType::kF32, idx = DType::kI64;
  bool scale = false;
};

bool ebw_geometry(const OpCall& c, EbwGeom& e) {
  if (c.backend != BackendKind::kCuda || c.op != OpId::kEmbeddingBackward || !c.dense() || c.outputs.size() != 1) return false;
  const TensorMeta *g = c.input("grad_output"), *ix = c.input("indices");
  if (!g || !ix || !g->defined || !ix->defined || g->sizes.empty() || !elem_dtype(g->dtype)) return false;
  if (ix->dtype != DType::kI64 && ix->dtype != DType::kI32) return false;
  e.g = g->dtype, e.idx = ix->dtype;
  e.n = ix->numel(), e.d = g->sizes.back(), e.w = c.int_arg("num_weights", 0);
  e.scale = c.int_arg("scale_grad_by_freq", 0) != 0;
  if (e.n <= 0 || e.d <= 0 || e.w <= 0 || g->numel() != e.n * e.d) return false;
  // Keys are ints up to W (the sentinel) and positions ints; start has W + 1 entries.
  if (e.n >= INT_MAX / 2 || e.w >= INT_MAX / 2) return false;
  const TensorMeta& o = c.outputs[0];
  return o.defined && o.dtype == e.g && o.sizes == std::vector<int64_t>{e.w, e.d};
}

bool atomic_ok(const EbwGeom& e) { return e.g == DType::kF32 && !e.scale; }
// Radix passes of 8 bits over keys in [0, W].
int64_t passes(int64_t w) {
  int64_t bits = 0;
  while ((int64_t{1} << bits) <= w) ++bits;
  return std::max<int64_t>(1, cdiv(bits, 8));
}

std::vector<KnobDim> ebw_space(const EbwGeom& e) {
  auto vecs = vec_values(e.g, e.d);
  const int64_t dv = e.d / vecs.back();
  const int64_t items = std::min<int64_t>(8, pow2_ceil(cdiv(dv, 32)));   // a pass covers the row when it can
  std::vector<KnobDim> sp = {{"vec", with_default(vecs, vecs.back())},
                             {"items", with_default({1, 2, 4, 8}, items)},
                             {"rows", with_default({1, 2, 4, 8, 16}, 4)},
                             {"sort_threads", {512, 256, 1024, 128}},
                             {"chunk", with_default({0, 4, 8, 16, 32, 64}, std::clamp<int64_t>(pow2_ceil(cdiv(e.n, 1024)), 4, 64))}};
  // Float atomics only on fp32 (16-bit atomics would round at every addition), and only without
  // scale_grad_by_freq (which needs each row's count).
  // 1: an atomic an element; 2: an atomic a vector (sm_90's float2 / float4; elsewhere as 1).
  if (atomic_ok(e)) sp.push_back({"atomic", {0, 1, 2}});
  return sp;
}

std::string ebw_consts(const EbwGeom& e, const Knobs& k) {
  return "constexpr int NTS = " + S(k.at("sort_threads")) + ", VEC = " + S(k.at("vec")) + ", ITEMS = " +
         S(k.at("items")) + ", RPB = " + S(k.at("rows")) + ";\nconstexpr bool SCALE = " + (e.scale ? "true" : "false") +
         ";\ntypedef " + (e.idx == DType::kI64 ? "long long" : "int") + " IT;\n#define CH " + S(k.at("chunk")) + "\n";
}

// The launch list and scratch of a setting; sizes are expressions over the call.
std::pair<json, json> ebw_launches(const EbwGeom& e, const Knobs& k) {
  if (k.count("atomic") && k.at("atomic")) return {ebw_atomic_launches(k.at("vec"), k.at("rows")), nullptr};
  const int64_t nts = k.at("sort_threads"), vec = k.at("vec"), rpb = k.at("rows");
  const std::string n = "numel(indices)", nb = "ceil_div(" + n + ", " + S(nts) + ")";
  const std::string keys[2] = {"kc_ka", "kc_kb"}, vals[2] = {"kc_va", "kc_vb"};
  const std::vector<std::string> common = {"i32:" + n, "i64:num_weights", "i64:padding_idx"};
  json ls = json::array();
  const int64_t P = passes(e.w);
  for (int64_t p = 0; p < P; ++p) {
    const std::string shift = "i32:" + S(8 * p), first = "i32:" + S(p == 0 ? 1 : 0);
    const std::string& kin = keys[(p + 1) % 2];   // unread in the first pass (it reads indices)
    const std::string& vin = vals[(p + 1) % 2];
    std::vector<std::string> h = {"ptr:kc_hist", "ptr:indices", "ptr:" + kin};
    h.insert(h.end(), common.begin(), common.end());
    h.insert(h.end(), {shift, "i32:" + nb, first});
    ls.push_back(launch("kc_ebw_hist", {nb}, {nts}, h));
    ls.push_back(launch("kc_ebw_scan", {1}, {1024}, {"ptr:kc_hist", "i32:256 * " + nb}));
    std::vector<std::string> s = {"ptr:" + keys[p % 2], "ptr:" + vals[p % 2], "ptr:indices", "ptr:" + kin, "ptr:" + vin, "ptr:kc_hist"};
    s.insert(s.end(), common.begin(), common.end());
    s.insert(s.end(), {shift, "i32:" + nb, first});
    ls.push_back(launch("kc_ebw_scatter", {nb}, {nts}, s));
  }
  const int64_t last = (P - 1) % 2;
  ls.push_back(launch("kc_ebw_bounds", {"ceil_div(" + n + " + 1, 256)"}, {256}, {"ptr:kc_start", "ptr:" + keys[last], "i32:" + n, "i32:num_weights"}));
  const std::string rows_grid = "ceil_div(num_weights, " + S(rpb) + ")", dv = "i64:size(grad_output,-1) / " + S(vec);
  json scratch = json::array({{{"name", "kc_hist"}, {"bytes", "1024 * " + nb}}});
  if (const int64_t ch = k.at("chunk"); ch == 0) {
    ls.push_back(launch("kc_ebw_sum", {rows_grid}, {32 * rpb},
                        {"ptr:out0", "ptr:grad_output", "ptr:" + vals[last], "ptr:kc_start", "i32:num_weights", dv}));
  } else {
    const std::string nq = "ceil_div(" + n + ", " + S(ch) + ")";
    ls.push_back(launch("kc_ebw_seg", {"ceil_div(" + nq + ", " + S(rpb) + ")"}, {32 * rpb},
                        {"ptr:out0", "ptr:kc_part", "ptr:grad_output", "ptr:" + keys[last], "ptr:" + vals[last], "ptr:kc_start",
                         "i32:" + n, "i32:num_weights", dv}));
    ls.push_back(launch("kc_ebw_fix", {rows_grid}, {32 * rpb}, {"ptr:out0", "ptr:kc_part", "ptr:kc_start", "i32:num_weights", dv}));
    scratch.push_back({{"name", "kc_part"}, {"bytes", "2 * " + nq + " * size(grad_output,-1) * 4"}});   // two fp32 rows a chunk
  }
  for (const std::string& b : {keys[0], vals[0], keys[1], vals[1]}) scratch.push_back({{"name", b}, {"bytes", n + " * 4"}});
  scratch.push_back({{"name", "kc_start"}, {"bytes", "(num_weights + 1) * 4"}});
  return {ls, scratch};
}

class EmbeddingBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.embedding_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    EbwGeom e;
    return ebw_geometry(c, e) ? ebw_space(e) : std::vector<KnobDim>{};
  }
  // The atomic variant in the first generation: the default is the deterministic sort.
  std::vector<Knobs> seeds(const OpCall& c) const override {
    EbwGeom e;
    if (!ebw_geometry(c, e) || !atomic_ok(e)) return {};
    return {{{"atomic", 2}}, {{"atomic", 1}}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    EbwGeom e;
    if (!ebw_geometry(c, e)) return unsupported("cuda.embedding_backward does not handle this call");
    auto kr = pick(ebw_space(e), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    if (e.d % k["vec"] != 0) return unsupported("vec " + S(k["vec"]) + " does not divide D (" + S(e.d) + ")");
    const bool atomic = k.count("atomic") && k.at("atomic");
    if (atomic) k["items"] = 1, k["sort_threads"] = 512, k["chunk"] = 0;   // the sort's knobs: unused
    const std::string src = "// kernelcraft cuda.embedding_backward " + std::string(dtype_name(e.g)) + " indices " +
                            dtype_name(e.idx) + (e.scale ? " scale_grad_by_freq" : "") + (atomic ? " atomic" : "") + "\n" +
                            dtype_prelude(e.g) + ebw_consts(e, k) + (atomic ? ebw_atomic_body(k.at("atomic") == 2) : std::string(kEbwBody));
    auto [ls, scratch] = ebw_launches(e, k);
    Candidate out = make_candidate(name(), std::move(k), src, std::move(ls), std::move(scratch));
    out.repeatable = !atomic;   // float atomics add in whatever order the warps run
    return out;
  }
};

}  // namespace

const Template* cuda_embedding_backward_template() {
  static const EmbeddingBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
