// CUDA KL divergence templates (cuda.kl_div, cuda.kl_div_backward): kernelcraft::kl_div and its
// backward over dense self and target of one shape, f32 / f16 / bf16, fp32 math.
//
// Forward, reduction none: one elementwise pass (VEC-wide loads, UNROLL vectors a thread a round).
// Mean and sum are the point: eager runs xlogy, mul and sub (or exp, sub and mul), each a pass
// over memory with a tensor of the input's size written, then a reduction over it; here self and
// target are read once and every term is summed as it is computed. The reduction is cuda.loss's,
// deterministic and two-stage (knob "blocks" = P): P blocks grid-stride over the vectors, each
// thread loads its UNROLL vectors of both tensors before using any (so the loads are in flight
// together) and sums its terms in fp32 in a fixed order, each block folds its threads in a fixed
// order (kc_gsum) into part[block], and a one-block launch folds the P partials in order. No
// atomics: the bits depend only on the knobs and the size. P = 1 is one launch that writes the
// result itself (small calls). Backward: one elementwise pass, -t g or -exp(t) g.
#include "evolve/ops/kl_div.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// One term in fp32 as eager forms it: xlogy(t, t) - t x (0 * log 0 = 0, NaN kept), or with
// log_target exp(t) (t - x). Accurate logf / expf (no fast math).
const char* kTermFn = R"CU(
__device__ __forceinline__ float kc_term(float x, float t) {
  if constexpr (LOG_T) return expf(t) * (t - x);
  else return (t == 0.f ? 0.f : t * logf(t)) - t * x;
}
__device__ __forceinline__ V kc_ldv(const T* __restrict__ p, long long v) { return reinterpret_cast<const V*>(p)[v]; }
)CU";

// The forward's kernels. Vector v covers elements [v VEC, v VEC + VEC); block 0 takes the tail.
const char* kForward = R"CU(
extern "C" __global__ void __launch_bounds__(NT) kc_kl_map(T* __restrict__ out, const T* __restrict__ x,
                                                           const T* __restrict__ t, long long n) {
  const long long nv = n / VEC, step = (long long)gridDim.x * NT * UNROLL;
  for (long long i = (long long)blockIdx.x * NT * UNROLL + threadIdx.x; i < nv; i += step) {
    V xv[UNROLL], tv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv) { xv[u] = kc_ldv(x, i + u * NT); tv[u] = kc_ldv(t, i + u * NT); }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_term(ld(xv[u].v[e]), ld(tv[u].v[e])));
        reinterpret_cast<V*>(out)[i + u * NT] = o;
      }
  }
  if (blockIdx.x == 0)
    for (long long k = nv * VEC + threadIdx.x; k < n; k += NT) out[k] = st(kc_term(ld(x[k]), ld(t[k])));
}
__device__ __forceinline__ void kc_store(T* out, float acc, long long n) {
  out[0] = st(MEAN ? (float)((double)acc / (double)n) : acc);
}
extern "C" __global__ void __launch_bounds__(NT) kc_kl_part(float* __restrict__ part, T* __restrict__ out,
    const T* __restrict__ x, const T* __restrict__ t, long long n) {
  __shared__ float sh[64];
  float acc = 0.f;
  const long long nv = n / VEC, step = (long long)gridDim.x * NT * UNROLL;
  for (long long i = (long long)blockIdx.x * NT * UNROLL + threadIdx.x; i < nv; i += step) {
    V xv[UNROLL], tv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv) { xv[u] = kc_ldv(x, i + u * NT); tv[u] = kc_ldv(t, i + u * NT); }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc += kc_term(ld(xv[u].v[e]), ld(tv[u].v[e]));
  }
  if (blockIdx.x == 0)
    for (long long k = nv * VEC + threadIdx.x; k < n; k += NT) acc += kc_term(ld(x[k]), ld(t[k]));
  acc = kc_gsum(acc, sh);
  if (threadIdx.x != 0) return;
  if constexpr (SINGLE) kc_store(out, acc, n);
  else part[blockIdx.x] = acc;
}
extern "C" __global__ void __launch_bounds__(NT) kc_kl_final(T* __restrict__ out, const float* __restrict__ part,
                                                             int P, long long n) {
  __shared__ float sh[64];
  float acc = 0.f;
  for (int i = threadIdx.x; i < P; i += NT) acc += part[i];
  acc = kc_gsum(acc, sh);
  if (threadIdx.x == 0) kc_store(out, acc, n);
}
)CU";

// The composite's autograd per element: -(g t) or -(g exp(t)); the mean's g is grad / n in fp32,
// as eager's MeanBackward divides.
const char* kBackward = R"CU(
__device__ __forceinline__ float kc_grad(float g, float t) { return -(g * (LOG_T ? expf(t) : t)); }
extern "C" __global__ void __launch_bounds__(NT) kc_kl_grad(T* __restrict__ out, const T* __restrict__ go,
                                                            const T* __restrict__ t, long long n) {
  const float g0 = GSCALAR ? (MEAN ? ld(go[0]) / (float)n : ld(go[0])) : 0.f;
  const long long nv = n / VEC, step = (long long)gridDim.x * NT * UNROLL;
  for (long long i = (long long)blockIdx.x * NT * UNROLL + threadIdx.x; i < nv; i += step) {
    V tv[UNROLL], gv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv) {
        tv[u] = kc_ldv(t, i + u * NT);
        if constexpr (!GSCALAR) gv[u] = kc_ldv(go, i + u * NT);
      }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u * NT < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_grad(GSCALAR ? g0 : ld(gv[u].v[e]), ld(tv[u].v[e])));
        reinterpret_cast<V*>(out)[i + u * NT] = o;
      }
  }
  if (blockIdx.x == 0)
    for (long long k = nv * VEC + threadIdx.x; k < n; k += NT) out[k] = st(kc_grad(GSCALAR ? g0 : ld(go[k]), ld(t[k])));
}
)CU";

const std::vector<int64_t> kBlocks = {1, 132, 264, 528, 1056, 2112};

bool handles(const OpCall& c, OpFamily fam, KlDivGeom& g) {
  if (c.backend != BackendKind::kCuda || op_info(c.op).family != fam || !c.dense()) return false;
  auto r = kl_div_geometry(c);
  if (!r.is_ok() || r->terms <= 0 || !elem_dtype(r->dt)) return false;
  g = r.value();
  return c.outputs.size() == 1 && c.outputs[0].defined && c.outputs[0].dtype == g.dt;
}

std::vector<int64_t> vecs(DType dt) {
  return dt == DType::kF32 ? std::vector<int64_t>{4, 1, 2} : std::vector<int64_t>{8, 1, 2, 4};
}

std::string prelude(const char* tpl, const KlDivGeom& g, int64_t nt, int64_t vec, int64_t u, bool single) {
  return "// kernelcraft " + std::string(tpl) + " " + dtype_name(g.dt) + "\n" + dtype_prelude(g.dt) +
         "constexpr int G = " + S(nt) + ", NT = G, VEC = " + S(vec) + ", UNROLL = " + S(u) + ";\n" +
         "constexpr bool LOG_T = " + (g.log_target ? "true" : "false") +
         ", MEAN = " + (g.reduction == LossReduction::kMean ? "true" : "false") +
         ", SINGLE = " + (single ? "true" : "false") + ", GSCALAR = " + (g.elementwise() ? "false" : "true") + ";\n" +
         kGroupHelpers + kTermFn;
}

// Grid-stride rounds over the vectors of numel(self).
std::string rounds(int64_t vec, int64_t nt, int64_t u) {
  return "max(1, ceil_div(numel(self) / " + S(vec) + ", " + S(nt * u) + "))";
}

class KlDivTemplate : public Template {
 public:
  const char* name() const override { return "cuda.kl_div"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDiv, g)) return {};
    std::vector<KnobDim> sp = {{"threads", {256, 128, 512, 1024}}, {"unroll", {2, 1, 4}}, {"vec", vecs(g.dt)}};
    if (g.elementwise()) {
      sp.push_back({"gs", {1, 0}});   // grid stride over a capped grid, or one round a thread
    } else {
      // One block for small calls, else about eight 256-thread blocks an SM (a full H200).
      const int64_t work = g.terms / 4;
      sp.push_back({"blocks", with_default(kBlocks, work < 16384 ? 1 : work < (int64_t{1} << 21) ? 264 : 1056)});
    }
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDiv, g)) return unsupported("cuda.kl_div does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    const Knobs k = kr.value();
    const int64_t nt = k.at("threads"), u = k.at("unroll"), vec = k.at("vec");
    const bool map = g.elementwise();
    const int64_t blocks = map ? 0 : k.at("blocks");
    std::string src = prelude(name(), g, nt, vec, u, blocks == 1) + kForward;
    const std::string r = rounds(vec, nt, u);
    json ls = json::array(), scratch = nullptr;
    if (map) {
      const std::string grid = k.at("gs") ? "min(" + r + ", " + S(kSms * (2048 / nt)) + ")" : r;
      ls.push_back(launch("kc_kl_map", {grid}, {nt}, {"ptr:out0", "ptr:self", "ptr:target", "i64:numel(self)"}));
      return make_candidate(name(), k, std::move(src), std::move(ls));
    }
    const std::string P = blocks == 1 ? "1" : "min(" + S(blocks) + ", " + r + ")";
    ls.push_back(launch("kc_kl_part", {P}, {nt}, {"ptr:part", "ptr:out0", "ptr:self", "ptr:target", "i64:numel(self)"}));
    if (blocks > 1) ls.push_back(launch("kc_kl_final", {1}, {nt}, {"ptr:out0", "ptr:part", "i32:" + P, "i64:numel(self)"}));
    // The partials (a 4-byte placeholder for the single launch, whose part pointer goes unused).
    scratch = json::array({{{"name", "part"}, {"bytes", S(std::max<int64_t>(blocks, 1) * 4)}}});
    return make_candidate(name(), k, std::move(src), std::move(ls), std::move(scratch));
  }
};

class KlDivBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.kl_div_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDivBackward, g)) return {};
    return {{"threads", {256, 128, 512, 1024}}, {"vec", vecs(g.dt)}, {"unroll", {2, 1, 4}}, {"gs", {1, 0}}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    KlDivGeom g;
    if (!handles(c, OpFamily::kKlDivBackward, g)) return unsupported("cuda.kl_div_backward does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    const Knobs k = kr.value();
    const int64_t nt = k.at("threads"), vec = k.at("vec"), u = k.at("unroll");
    std::string src = prelude(name(), g, nt, vec, u, false) + kBackward;
    const std::string r = rounds(vec, nt, u);
    const std::string grid = k.at("gs") ? "min(" + r + ", " + S(kSms * (2048 / nt)) + ")" : r;
    return make_candidate(name(), k, std::move(src),
                          json::array({launch("kc_kl_grad", {grid}, {nt}, {"ptr:out0", "ptr:grad", "ptr:target", "i64:numel(self)"})}));
  }
};

}  // namespace

const Template* cuda_kl_div_template() {
  static const KlDivTemplate t;
  return &t;
}

const Template* cuda_kl_div_backward_template() {
  static const KlDivBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
