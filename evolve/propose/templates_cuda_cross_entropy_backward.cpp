// CUDA fused cross-entropy backward (cuda.cross_entropy_backward): kernelcraft::
// cross_entropy_backward, grad_self from the forward's lse (evolve/ops/cross_entropy.h has the
// formulas). Eager's autograd runs nll_loss_backward (zero-fills and scatters a [N, C] tensor),
// the smoothing sum's backward and log_softmax_backward (reads that tensor and the saved
// log-probabilities): here each element is exp(x - lse) times two per-row constants, less a
// weight, so self is read once and grad_self written once (probabilities: the target is read
// twice, once for the row's sum_k w_k q_k).
//
// Class targets need two call-wide sums, the mean's D (weights of the rows not ignored) and, for
// weighted smoothing, W = sum_j w_j: kc_ce_prep computes them in one block in a fixed order and
// the row kernel reads them; calls that need neither are one launch. Ignored rows write zeros; a
// target neither ignored nor a class writes NaN over its row (the mean's D too, so every row not
// ignored; eager raises, a kernel must not read outside self). A row holding +inf (lse is +inf) is NaN throughout, as eager's softmax is.
// Knobs as the forward's (templates_cuda_cross_entropy.cpp): threads (long rows 512 by
// default), rows, vec, unroll. On the H200 the 8192 x 128256 bf16 gradient takes 1.07 ms
// (3.9 TB/s for self read and grad_self written); eager's forward and backward together take
// 4.7 ms, the two templates' kernels timed apart 0.53 + 1.07 ms (torch 2.11).
#include "evolve/propose/templates_cross_entropy.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {

namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kPrepBody = R"CU(
extern "C" __global__ void __launch_bounds__(FT) kc_ce_prep(float* __restrict__ stat, const long long* __restrict__ tg
    KC_W_PARAM, long long rows, int C, long long ign) {
  KC_W_LOCAL
  double d = 0, ws = 0;
  if constexpr (MEAN)
    for (long long i = threadIdx.x; i < rows; i += FT) {
      const long long c = tg[i];
      if (c == ign) continue;
      d += c < 0 || c >= C ? (double)KC_NAN : HAS_W ? (double)kc_f(w[c]) : 1.0;
    }
  if constexpr (HAS_W && SMOOTH)
    for (int j = threadIdx.x; j < C; j += FT) ws += kc_f(w[j]);
  kc_bsum2(d, ws);
  if (threadIdx.x == 0) { stat[0] = (float)d; stat[1] = (float)ws; }
}
)CU";

const char* kGradBody = R"CU(
// A sum over the row's G threads, the same bits in each.
__device__ __forceinline__ float kc_gsum1(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (G > 32) {
    __shared__ float sh[G / 32];
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) v += sh[w];
  }
  return v;
}
// grad_self[j] = s (P_j Q - w_j q_j), Q = sum_k w_k q_k (q = (1 - e) p + e / C).
__device__ __forceinline__ void kc_probs_row(T* __restrict__ gxr, const T* __restrict__ xr, const TGT* __restrict__ pr,
                                             const WT* __restrict__ w, int t, int nv, float s, float l, float qa, float qb) {
  float q = 0.f;
  for (int i0 = t; i0 < nv; i0 += G * U) {
    KcVec<TGT> ps[U];
    KcVec<WT> ws[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * G < nv) {
        const long long j = (long long)(i0 + u * G) * VEC;
        ps[u] = kc_ldv(pr + j);
        if constexpr (HAS_W) ws[u] = kc_ldv(w + j);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * G < nv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) q += (HAS_W ? kc_f(ws[u].v[e]) : 1.f) * (qa * kc_f(ps[u].v[e]) + qb);
  }
  q = kc_gsum1(q);
  for (int i0 = t; i0 < nv; i0 += G * U) {
    KcVec<T> xs[U];
    KcVec<TGT> ps[U];
    KcVec<WT> ws[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * G < nv) {
        const long long j = (long long)(i0 + u * G) * VEC;
        xs[u] = kc_ldv(xr + j);
        ps[u] = kc_ldv(pr + j);
        if constexpr (HAS_W) ws[u] = kc_ldv(w + j);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * G < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float wq = (HAS_W ? kc_f(ws[u].v[e]) : 1.f) * (qa * kc_f(ps[u].v[e]) + qb);
          o.v[e] = st(s * (expf(ld(xs[u].v[e]) - l) * q - wq));
        }
        reinterpret_cast<V*>(gxr)[i0 + u * G] = o;
      }
  }
}
// grad_self[j] = A (P_j - [j == c]) + B (W P_j - w_j), A = s (1 - e) w_c, B = s e / C.
__device__ __forceinline__ void kc_class_row(T* __restrict__ gxr, const T* __restrict__ xr, const WT* __restrict__ w,
                                             long long c, int t, int nv, float l, float A, float B, float W) {
  for (int i0 = t; i0 < nv; i0 += G * U) {
    KcVec<T> xs[U];
    KcVec<WT> ws[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * G < nv) {
        const long long j = (long long)(i0 + u * G) * VEC;
        xs[u] = kc_ldv(xr + j);
        if constexpr (HAS_W && SMOOTH) ws[u] = kc_ldv(w + j);
      }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * G < nv) {
        const long long j = (long long)(i0 + u * G) * VEC;
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float P = expf(ld(xs[u].v[e]) - l);
          float g = A * (P - (j + e == c ? 1.f : 0.f));
          if constexpr (SMOOTH) g += B * (W * P - (HAS_W ? kc_f(ws[u].v[e]) : 1.f));
          o.v[e] = st(g);
        }
        reinterpret_cast<V*>(gxr)[i0 + u * G] = o;
      }
  }
}
extern "C" __global__ void __launch_bounds__(NT) kc_ce_grad(T* __restrict__ gx, const LT* __restrict__ gr,
    const T* __restrict__ x, const TGT* __restrict__ tg KC_W_PARAM, const float* __restrict__ lse KC_ST_PARAM,
    long long rows, int C, long long ign, float eps) {
  KC_W_LOCAL
  KC_ST_LOCAL
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  float s = kc_f(gr[PER_ROW ? row : 0]);
  if constexpr (MEAN) s = PROBS ? s / (float)rows : s / stat[0];
  float l = lse[row];
  l = l == KC_INF ? KC_NAN : l;
  T* gxr = gx + row * C;
  const T* xr = x + row * C;
  const int nv = C / VEC;
  const float qa = 1.f - eps, qb = eps / (float)C;
  if constexpr (PROBS) {
    kc_probs_row(gxr, xr, tg + row * C, w, t, nv, s, l, qa, qb);
  } else {
    const long long c = tg[row];
    if (c == ign || c < 0 || c >= C) {
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(c == ign ? 0.f : KC_NAN);
      for (int i = t; i < nv; i += G) reinterpret_cast<V*>(gxr)[i] = o;
      return;
    }
    const float wt = HAS_W ? kc_f(w[c]) : 1.f;
    kc_class_row(gxr, xr, w, c, t, nv, l, s * qa * wt, s * qb, HAS_W && SMOOTH ? stat[1] : (float)C);
  }
}
)CU";

class CrossEntropyBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.cross_entropy_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    CeCall f;
    if (!ce_call(c, BackendKind::kCuda, OpFamily::kCrossEntropyBackward, f)) return {};
    // Long rows: 512 threads a row (8192 x 128256 bf16 on the H200: 1.07 ms, 3.9 TB/s read and
    // written, against 1.28 ms with 1024).
    return ce_cuda_space(f, 512, 2);
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    CeCall f;
    if (!ce_call(c, BackendKind::kCuda, OpFamily::kCrossEntropyBackward, f))
      return unsupported("cuda.cross_entropy_backward does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    auto gr = row_geom(k, f.g.classes);
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    if (cdiv(f.g.classes / r.vec, r.g) <= 1) k["unroll"] = 1;   // one round: unroll changes nothing
    const int64_t u = k.at("unroll"), words = ce_cuda_words(f, u, r.vec);
    if (words > 2 * reg_budget(r.g * r.rpb))
      return unsupported("unroll " + S(u) + " of " + S(r.vec) + "-wide vectors needs " + S(words) + " registers a thread");
    const bool smooth = f.g.label_smoothing > 0;
    const bool prep = !f.g.probs && (f.g.reduction == LossReduction::kMean || (f.g.weighted && smooth));
    std::string src = "// kernelcraft cuda.cross_entropy_backward " + std::string(dtype_name(f.x)) + "\n" +
                      ce_cuda_prelude(f, r, u) +
                      (prep ? "#define KC_ST_PARAM , const float* __restrict__ stat\n#define KC_ST_LOCAL\n"
                            : "#define KC_ST_PARAM\n#define KC_ST_LOCAL const float* stat = nullptr; (void)stat;\n") +
                      (prep ? kPrepBody : "") + kGradBody;
    const std::string rows = ce_rows_expr(), cls = std::string("i32:") + ce_classes_expr();
    json ls = json::array();
    std::vector<std::string> wargs;
    if (f.g.weighted) wargs.push_back("ptr:weight");
    if (prep) {
      std::vector<std::string> a = {"ptr:st", "ptr:target"};
      a.insert(a.end(), wargs.begin(), wargs.end());
      a.insert(a.end(), {"i64:" + rows, cls, "i64:ignore_index"});
      ls.push_back(launch("kc_ce_prep", {1}, {256}, a));
    }
    std::vector<std::string> a = {"ptr:out0", "ptr:grad", "ptr:self", "ptr:target"};
    a.insert(a.end(), wargs.begin(), wargs.end());
    a.push_back("ptr:lse");
    if (prep) a.push_back("ptr:st");
    a.insert(a.end(), {"i64:" + rows, cls, "i64:ignore_index", "f32:label_smoothing"});
    ls.push_back(launch("kc_ce_grad", {row_grid(r, rows)}, {r.g * r.rpb}, a));
    json scratch;
    if (prep) scratch = json::array({{{"name", "st"}, {"bytes", 8}}});
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls), std::move(scratch));
  }
};

}  // namespace

const Template* cuda_cross_entropy_backward_template() {
  static const CrossEntropyBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
