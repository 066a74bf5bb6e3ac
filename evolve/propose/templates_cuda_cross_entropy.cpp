// CUDA fused cross-entropy forward (cuda.cross_entropy): kernelcraft::cross_entropy over self
// [N, C] or [C] in f32 / bf16 / f16, class or probability targets, optional weight, label
// smoothing, every reduction (evolve/ops/cross_entropy.h has the contract). fp32 math.
//
// Eager runs log_softmax (reads self, writes [N, C]) then nll_loss and, with smoothing, a second
// sum over the log-probabilities: three passes over a [N, C] tensor that for an LLM's vocabulary
// is the biggest activation of the step. Here a group of G threads owns a row (a warp, RPB rows a
// block, or the whole block for long rows) and reads it once: an online (max, sum of exp) per
// thread, merged across the group in a fixed order, and beside it the sums the loss needs (with
// smoothing sum_j w_j (x_j - x0) and sum_j w_j; with probabilities sum_j w_j q_j (x_j - x0) and
// sum_j w_j q_j, with x0 the row's first element where finite: shifting by it keeps those sums
// from cancelling against lse * W for logits far from zero). x_t is one gather by the row's
// first thread. The row writes lse and either its loss (reduction none; a 1-d self's 0-dim loss
// for every reduction) or its term and weight into scratch, which one block then folds in row
// order (kc_ce_final, in double): no atomics, so the bits depend on the knobs only.
//
// Knobs: threads / rows / vec (templates_cuda_common.h row_space: the widest 16-byte vector that
// divides C, a warp per row for small C, a block for long rows, by default at most 256 threads
// here) and unroll (vectors a thread loads before it uses them: memory-level parallelism for
// long rows, 4 by default there). On the H200, 8192 rows of a 128256-token vocabulary in bf16
// take 0.53 ms (3.97 TB/s: self read once at about the copy kernels' bandwidth; eager's
// _log_softmax alone 1.98 ms, torch 2.11).
#include "evolve/propose/templates_cross_entropy.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {

namespace {

using namespace cuda_tpl;
using nlohmann::json;

// KcVec / kc_ldv load VEC elements of float or T in 16-byte chunks, so fp32 weights beside bf16
// logits still load aligned vectors; V is a vector of T. kc_bsum2 folds two doubles over a block of
// FT threads.
const char* kCommon = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
template <class P> struct KcVec { P v[VEC]; };
template <class P> __device__ __forceinline__ KcVec<P> kc_ldv(const P* __restrict__ p) {
  constexpr int VN = (int)(16 / sizeof(P)) < VEC ? (int)(16 / sizeof(P)) : VEC;
  struct alignas(sizeof(P) * VN) Ch { P v[VN]; };
  KcVec<P> r;
#pragma unroll
  for (int c = 0; c < VEC / VN; ++c) {
    const Ch ch = reinterpret_cast<const Ch*>(p)[c];
#pragma unroll
    for (int e = 0; e < VN; ++e) r.v[c * VN + e] = ch.v[e];
  }
  return r;
}
constexpr int FT = 256;
__device__ __forceinline__ void kc_bsum2(double& a, double& b) {
  __shared__ double sh[2][FT / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if ((threadIdx.x & 31) == 0) { sh[0][threadIdx.x >> 5] = a; sh[1][threadIdx.x >> 5] = b; }
  __syncthreads();
  a = sh[0][0];
  b = sh[1][0];
#pragma unroll
  for (int w = 1; w < FT / 32; ++w) { a += sh[0][w]; b += sh[1][w]; }
}
)CU";

const char* kRowsBody = R"CU(
// One vector into the online state (m, s = sum exp(x - m)): one rescale a vector at most; -inf
// adds nothing, NaN and +inf poison s as eager's exp would. While m is -inf every element seen
// is -inf or NaN, so the shift 0 gives exp(-inf) = 0 where -inf - -inf would give NaN.
__device__ __forceinline__ void kc_vupd(float& m, float& s, const float* v) {
  float vm = v[0];
#pragma unroll
  for (int e = 1; e < VEC; ++e) vm = fmaxf(vm, v[e]);
  if (vm > m) { s = __fmul_rn(s, expf(m - vm)); m = vm; }
  const float sh = m == -KC_INF ? 0.f : m;
#pragma unroll
  for (int e = 0; e < VEC; ++e) s += expf(v[e] - sh);
}
// A state whose max is -inf has s 0 or NaN: kept as it is (exp(-inf - -inf) would be NaN).
__device__ __forceinline__ void kc_merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  const float a = m == -KC_INF ? s : __fmul_rn(s, expf(m - mm));
  const float b = m2 == -KC_INF ? s2 : __fmul_rn(s2, expf(m2 - mm));
  m = mm;
  s = a + b;
}
// The group's state and sums, complete in its first thread. Merges are symmetric, so the xor
// butterfly leaves every lane the same bits; warps then fold in order.
__device__ __forceinline__ void kc_gmerge(float& m, float& s, float& a, float& b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    kc_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if constexpr (SUMS) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
  }
  if constexpr (G > 32) {
    __shared__ float sh[4][G / 32];
    const int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) { sh[0][w] = m; sh[1][w] = s; sh[2][w] = a; sh[3][w] = b; }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int k = 1; k < G / 32; ++k) {
      kc_merge(m, s, sh[0][k], sh[1][k]);
      a += sh[2][k];
      b += sh[3][k];
    }
  }
}
extern "C" __global__ void __launch_bounds__(NT) kc_ce_rows(LT* __restrict__ out, float* __restrict__ lse
    KC_PART_PARAM, const T* __restrict__ x, const TGT* __restrict__ tg KC_W_PARAM, long long rows, int C,
    long long ign, float eps) {
  KC_W_LOCAL
  KC_PART_LOCAL
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  const T* xr = x + row * C;
  float x0 = ld(xr[0]);
  x0 = fabsf(x0) < KC_INF ? x0 : 0.f;
  const float qa = 1.f - eps, qb = eps / (float)C;
  const int nv = C / VEC;
  float m = -KC_INF, s = 0.f, a = 0.f, b = 0.f;
  for (int i0 = t; i0 < nv; i0 += G * U) {
    KcVec<T> xs[U];
    KcVec<WT> ws[U];
    KcVec<TGT> ps[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long j = (long long)(i0 + u * G) * VEC;
      if (i0 + u * G < nv) {
        xs[u] = kc_ldv(xr + j);
        if constexpr (HAS_W && SUMS) ws[u] = kc_ldv(w + j);
        if constexpr (PROBS) ps[u] = kc_ldv(tg + row * C + j);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (i0 + u * G >= nv) break;
      float xf[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) xf[e] = ld(xs[u].v[e]);
      kc_vupd(m, s, xf);
      if constexpr (SUMS) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          float ww = 1.f;
          if constexpr (HAS_W) ww = kc_f(ws[u].v[e]);
          if constexpr (PROBS) ww *= qa * kc_f(ps[u].v[e]) + qb;
          a += ww * (xf[e] - x0);
          if constexpr (HAS_W || PROBS) b += ww;
        }
      }
    }
  }
  kc_gmerge(m, s, a, b);
  if (t != 0) return;
  const float l = m + logf(s);
  lse[row] = m == KC_INF ? KC_INF : l;   // logsumexp's value; the loss stays NaN, as eager's
  float term, wt = 1.f;
  if constexpr (PROBS) {
    term = (l - x0) * b - a;
  } else {
    const long long c = tg[row];
    if (c == ign) {
      term = 0.f;
      wt = 0.f;
    } else if (c < 0 || c >= C) {   // eager raises; a kernel must not read outside the row
      term = KC_NAN;
      wt = KC_NAN;
    } else {
      if constexpr (HAS_W) wt = kc_f(w[c]);
      term = qa * wt * (l - ld(xr[c]));
      if constexpr (SMOOTH) term += qb * ((l - x0) * (HAS_W ? b : (float)C) - a);
    }
  }
  if constexpr (DIRECT) out[row] = kc_lt(MEAN ? term / wt : term);
  else { part[2 * row] = term; part[2 * row + 1] = wt; }
}
// The reduced loss: the rows' terms and weights summed in row order; mean divides by the weights'
// sum (0 / 0 = NaN when every row is ignored; 1 a row for probabilities: N).
extern "C" __global__ void __launch_bounds__(FT) kc_ce_final(LT* __restrict__ out, const float* __restrict__ part,
                                                            long long rows) {
  double s = 0, d = 0;
  for (long long i = threadIdx.x; i < rows; i += FT) {
    s += part[2 * i];
    d += part[2 * i + 1];
  }
  kc_bsum2(s, d);
  if (threadIdx.x == 0) out[0] = kc_lt((float)(MEAN ? s / d : s));
}
)CU";

class CrossEntropyTemplate : public Template {
 public:
  const char* name() const override { return "cuda.cross_entropy"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    CeCall f;
    if (!ce_call(c, BackendKind::kCuda, OpFamily::kCrossEntropy, f)) return {};
    // Long rows: 256 threads with 4 loads in flight each beat a block of 1024 on the H200 (8192 x
    // 128256 bf16: 0.53 ms, 3.97 TB/s, against 0.63 ms).
    return ce_cuda_space(f, 256, 4);
  }

  // Long rows: twice the threads with half the loads in flight; warp rows: a block per row.
  std::vector<Knobs> seeds(const OpCall& c) const override {
    auto sp = space(c);
    if (sp.empty()) return {};
    const int64_t g = sp[0].values.front();
    if (g > 32) return {{{"threads", 2 * g}, {"unroll", 2}}};
    return {{{"threads", 128}, {"unroll", 1}}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    CeCall f;
    if (!ce_call(c, BackendKind::kCuda, OpFamily::kCrossEntropy, f)) return unsupported("cuda.cross_entropy does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    auto gr = row_geom(k, f.g.classes);
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    // One round covers the row: unroll changes nothing, so it takes its canonical value.
    if (cdiv(f.g.classes / r.vec, r.g) <= 1) k["unroll"] = 1;
    const int64_t u = k.at("unroll"), words = ce_cuda_words(f, u, r.vec);
    if (words > 2 * reg_budget(r.g * r.rpb))
      return unsupported("unroll " + S(u) + " of " + S(r.vec) + "-wide vectors needs " + S(words) + " registers a thread");
    const bool direct = f.g.per_row() || f.g.one_d;
    std::string src = "// kernelcraft cuda.cross_entropy " + std::string(dtype_name(f.x)) + "\n" +
                      ce_cuda_prelude(f, r, u) + "constexpr bool DIRECT = " + (direct ? "true" : "false") + ";\n" +
                      (direct ? "#define KC_PART_PARAM\n#define KC_PART_LOCAL float* part = nullptr; (void)part;\n"
                              : "#define KC_PART_PARAM , float* __restrict__ part\n#define KC_PART_LOCAL\n") +
                      kRowsBody;
    std::vector<std::string> args = {"ptr:out0", "ptr:out1"};
    if (!direct) args.push_back("ptr:part");
    args.insert(args.end(), {"ptr:self", "ptr:target"});
    if (f.g.weighted) args.push_back("ptr:weight");
    const std::string rows = ce_rows_expr();
    args.insert(args.end(), {"i64:" + rows, std::string("i32:") + ce_classes_expr(), "i64:ignore_index", "f32:label_smoothing"});
    json ls = json::array({launch("kc_ce_rows", {row_grid(r, rows)}, {r.g * r.rpb}, args)});
    json scratch;
    if (!direct) {
      ls.push_back(launch("kc_ce_final", {1}, {256}, {"ptr:out0", "ptr:part", "i64:" + rows}));
      scratch = json::array({{{"name", "part"}, {"bytes", "(" + rows + ") * 8"}}});
    }
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls), std::move(scratch));
  }
};

}  // namespace

// T (self), WT (weight), TGT (int64 classes or the probabilities' type), LT (the loss: out0
// forward, grad backward); kc_f reads each as float (halves share T: one 16-bit dtype a call) and
// kc_lt stores a loss. Then the call's flags, the weight parameter, the row geometry and kCommon.
std::string ce_cuda_prelude(const CeCall& f, const RowGeom& r, int64_t unroll) {
  auto flag = [](bool b) { return b ? "true" : "false"; };
  // kc_f(long long) only keeps class-target calls well-formed in branches if constexpr discards.
  std::string s = dtype_prelude(f.x) + "__device__ __forceinline__ float kc_f(float v) { return v; }\n" +
                  "__device__ __forceinline__ float kc_f(long long v) { return (float)v; }\n";
  if (f.x != DType::kF32) s += "__device__ __forceinline__ float kc_f(T v) { return ld(v); }\n";
  s += std::string("typedef ") + ctype(f.g.weighted ? f.w : f.x) + " WT;\n";
  s += std::string("typedef ") + (f.g.probs ? ctype(f.q) : "long long") + " TGT;\n";
  s += std::string("typedef ") + ctype(f.loss) + " LT;\n";
  s += f.loss == DType::kF32 ? "__device__ __forceinline__ float kc_lt(float v) { return v; }\n"
                             : "__device__ __forceinline__ LT kc_lt(float v) { return st(v); }\n";
  const bool smooth = f.g.label_smoothing > 0;
  s += std::string("constexpr int U = ") + S(unroll) + ";\nconstexpr bool HAS_W = " + flag(f.g.weighted) +
       ", PROBS = " + flag(f.g.probs) + ", SMOOTH = " + flag(smooth) + ", SUMS = " + flag(f.g.probs || smooth) +
       ", MEAN = " + flag(f.g.reduction == LossReduction::kMean) + ", PER_ROW = " + flag(f.g.per_row()) + ";\n";
  s += f.g.weighted ? "#define KC_W_PARAM , const WT* __restrict__ w\n#define KC_W_LOCAL\n"
                    : "#define KC_W_PARAM\n#define KC_W_LOCAL const WT* w = nullptr; (void)w;\n";
  return s + row_consts(r) + kCommon;
}

// Registers (4-byte words) of the vectors a thread loads in one round: self's, and the weight's
// and probabilities' where the kernel reads them per element (the forward reads the weight per
// element only for its sums; counting it always is conservative for the backward's class rows).
int64_t ce_cuda_words(const CeCall& f, int64_t unroll, int64_t vec) {
  const bool per_elem_w = f.g.weighted && (f.g.probs || f.g.label_smoothing > 0 || f.g.backward);
  return unroll * vec * (dtype_size(f.x) + (per_elem_w ? dtype_size(f.w) : 0) + (f.g.probs ? dtype_size(f.q) : 0)) / 4;
}

// row_space's threads / rows / vec with long rows capped at `cap` threads, and unroll: its
// default `long_unroll` for capped rows, else 2, lowered until the default vector's loads fit
// the registers (a default must render).
std::vector<KnobDim> ce_cuda_space(const CeCall& f, int64_t cap, int64_t long_unroll) {
  std::vector<KnobDim> sp;
  row_space(sp, f.x, f.g.classes, false);
  const int64_t g = std::min<int64_t>(sp[0].values.front(), cap), vec = sp[2].values.front();
  sp[0].values = with_default(sp[0].values, g);
  int64_t u = g == cap ? long_unroll : 2;
  while (u > 1 && ce_cuda_words(f, u, vec) > 2 * reg_budget(g == 32 ? 32 * sp[1].values.front() : g)) u /= 2;
  sp.push_back({"unroll", with_default({1, 2, 4}, u)});
  return sp;
}

const Template* cuda_cross_entropy_template() {
  static const CrossEntropyTemplate t;
  return &t;
}

}  // namespace kc::evolve
