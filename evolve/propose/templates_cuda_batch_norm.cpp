// CUDA batch norm template (cuda.batch_norm): native_batch_norm forward, dense (N, C, *) input,
// f32 / bf16 / f16 with fp32 statistics. Part of the CUDA op-family templates; shared pieces in
// templates_cuda_common.h.
//
// A channel c is N planes of HxW contiguous elements, C planes apart. Training (no running
// statistics: a call with them is served as this one, dispatcher/running_stats.h):
//   1. kc_bn_stats: P blocks per channel ("bpc"), each a contiguous slice of the channel's
//      (n, hw) vectors, write its Welford (mean, M2) into scratch "part";
//   2. kc_bn_finalize: one block per channel combines its P partials in a fixed order (so the
//      result is deterministic), writes save_mean / save_invstd and the per-channel
//      (mean, invstd * w, b) into scratch "ss";
//   3. kc_bn_apply: planes x pieces of ITEMS * NT vectors, y = (x - mean) * a + b.
//   or, with "fuse" = CL > 0, kc_bn_fused: one launch, a cluster of CL blocks per channel, each
//   block the statistics of its slice, the cluster's CL partials combined in a fixed order after
//   a cluster barrier, then the same block normalizes the same slice. The second read of a slice
//   follows its first closely enough to come from L2 (132 SMs x a slice of up to ~256 KB stays
//   under the H200's 50 MB), so DRAM sees one read and one write, against two reads for the
//   three launches when the input is larger than L2.
//   With "regs" the fused launch keeps its slice in registers (RI vectors a thread), so its second
//   pass reads no memory at all: slices of at most 16 (1024 threads) or 32 floats a thread.
// Eval: kc_bn_eval, the same plane pass with (mean, a, b) from the running statistics; the first
// block of each channel writes save_mean = running_mean and save_invstd (eager's CUDA answer).
// Vectors need VEC | HxW so one never straddles two planes. Sizes are kernel arguments (64-bit
// offsets), so one source serves every shape of a dtype and knob setting.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_norm.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kBnBody = R"CU(
// (x - m) * a + b, the subtraction first: exact for x near m, where a folded shift would cancel.
__device__ __forceinline__ void kc_plane(T* __restrict__ y, const T* __restrict__ x, long long plane, int q,
                                         long long HWV, float m, float a, float b) {
  const V* xv = reinterpret_cast<const V*>(x) + plane * HWV;
  V* yv = reinterpret_cast<V*>(y) + plane * HWV;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const long long i = ((long long)q * ITEMS + k) * NT + threadIdx.x;
    if (i < HWV) {
      const V v = xv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(fmaf(ld(v.v[e]) - m, a, b));
      yv[i] = o;
    }
  }
}

// Where vector i of channel c's N * HWV vectors is, in vectors from the input's start.
__device__ __forceinline__ long long kc_bn_at(long long i, int c, int C, long long HWV) {
  const long long n = i / HWV;
  return (n * C + c) * HWV + (i - n * HWV);
}
// The statistics of vectors [i, hi) of channel c, one plane segment at a time.
__device__ __forceinline__ void kc_bn_slice_stats(KcW& a, const T* __restrict__ x, int c, int C, long long HWV,
                                                  long long i, long long hi) {
  while (i < hi) {
    const long long n = i / HWV, j0 = i - n * HWV, j1 = min(HWV, j0 + (hi - i));
    const V* xv = reinterpret_cast<const V*>(x) + (n * C + c) * HWV;
    for (long long j = j0 + threadIdx.x; j < j1; j += NT) {
      float vm, vq;
      kc_vstats(xv[j], vm, vq);
      kc_wadd(a, (float)VEC, vm, vq);
    }
    i += j1 - j0;
  }
}

extern "C" __global__ void __launch_bounds__(NT) kc_bn_stats(float* __restrict__ part, const T* __restrict__ x,
                                                             int C, long long HWV, long long TOTV, int P) {
  __shared__ float sh[96];
  const int c = blockIdx.x / P, p = blockIdx.x % P;
  const long long per = kc_slice(TOTV, P);
  const long long lo = (long long)p * per;
  KcW a{0.f, 0.f, 0.f};
  kc_bn_slice_stats(a, x, c, C, HWV, lo, min(TOTV, lo + per));
  kc_gwelford(a, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = a.m; part[2 * (long long)blockIdx.x + 1] = a.q; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_bn_finalize(float* __restrict__ mean, float* __restrict__ invstd,
    float* __restrict__ ss, const float* __restrict__ part KC_WB_PARAMS, long long TOTV, int P, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const int c = blockIdx.x;
  const long long per = kc_slice(TOTV, P);
  const float* pr = part + 2 * (long long)c * P;
  KcW a{0.f, 0.f, 0.f};
  for (int p = threadIdx.x; p < P; p += NT) {
    const long long nv = min(per, max(0LL, TOTV - (long long)p * per));
    kc_wadd(a, (float)(nv * VEC), pr[2 * p], pr[2 * p + 1]);
  }
  kc_gwelford(a, sh);
  if (threadIdx.x == 0) {
    const float rs = 1.f / sqrtf(fmaxf(a.q / (float)(TOTV * VEC), 0.f) + eps);
    mean[c] = a.m;
    invstd[c] = rs;
    ss[3 * c] = a.m;
    ss[3 * c + 1] = HAS_W ? rs * ldp(w[c]) : rs;
    ss[3 * c + 2] = HAS_B ? ldp(b[c]) : 0.f;
  }
}

#if CL > 0
// Grid: C * CL blocks; the CL blocks of channel c form one cluster.
extern "C" __global__ void __launch_bounds__(NT) KC_CLUSTER_DIMS kc_bn_fused(T* __restrict__ y,
    float* __restrict__ mean, float* __restrict__ invstd, float* __restrict__ part, const T* __restrict__ x
    KC_WB_PARAMS, int C, long long HWV, long long TOTV, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const int c = blockIdx.x / CL, p = blockIdx.x % CL;
  const long long per = kc_slice(TOTV, CL), lo = (long long)p * per, hi = min(TOTV, lo + per);
  KcW a{0.f, 0.f, 0.f};
  // RI > 0 (knob regs): the slice in registers, RI vectors a thread; the block's mean, then its
  // squares about that mean, from the registers, so the second read never touches memory.
  V rv[RI > 0 ? RI : 1];
  if constexpr (RI > 0) {
#pragma unroll
    for (int k = 0; k < RI; ++k)
      if (lo + threadIdx.x + (long long)k * NT < hi)
        rv[k] = reinterpret_cast<const V*>(x)[kc_bn_at(lo + threadIdx.x + (long long)k * NT, c, C, HWV)];
    a = kc_regs_stats(rv, lo, hi, sh);
  } else {
    kc_bn_slice_stats(a, x, c, C, HWV, lo, hi);
    kc_gwelford(a, sh);
  }
  if constexpr (CL > 1) kc_cluster_merge(a, part, (long long)c * CL, p, per, TOTV);
  const float rs = 1.f / sqrtf(fmaxf(a.q / (float)(TOTV * VEC), 0.f) + eps);
  if (p == 0 && threadIdx.x == 0) { mean[c] = a.m; invstd[c] = rs; }
  const float m = a.m, A = HAS_W ? rs * ldp(w[c]) : rs, B = HAS_B ? ldp(b[c]) : 0.f;
  if constexpr (RI > 0) {
#pragma unroll
    for (int k = 0; k < RI; ++k)
      if (lo + threadIdx.x + (long long)k * NT < hi) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(fmaf(ld(rv[k].v[e]) - m, A, B));
        reinterpret_cast<V*>(y)[kc_bn_at(lo + threadIdx.x + (long long)k * NT, c, C, HWV)] = o;
      }
    return;
  }
  for (long long i = lo; i < hi;) {
    const long long n = i / HWV, j0 = i - n * HWV, j1 = min(HWV, j0 + (hi - i));
    const V* xv = reinterpret_cast<const V*>(x) + (n * C + c) * HWV;
    V* yv = reinterpret_cast<V*>(y) + (n * C + c) * HWV;
    for (long long j = j0 + threadIdx.x; j < j1; j += NT) {
      const V v = xv[j];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(fmaf(ld(v.v[e]) - m, A, B));
      yv[j] = o;
    }
    i += j1 - j0;
  }
}
#endif

// Grid: N * C planes times Q pieces.
extern "C" __global__ void __launch_bounds__(NT) kc_bn_apply(T* __restrict__ y, const T* __restrict__ x,
                                                             const float* __restrict__ ss, int C, long long HWV, int Q) {
  const long long plane = blockIdx.x / Q;
  const int q = blockIdx.x % Q, c = (int)(plane % C);
  kc_plane(y, x, plane, q, HWV, ss[3 * c], ss[3 * c + 1], ss[3 * c + 2]);
}

extern "C" __global__ void __launch_bounds__(NT) kc_bn_eval(T* __restrict__ y, float* __restrict__ mean,
    float* __restrict__ invstd, const T* __restrict__ x KC_WB_PARAMS, const PT* __restrict__ rm,
    const PT* __restrict__ rv, int C, long long HWV, int Q, float eps) {
  KC_WB_LOCALS
  const long long plane = blockIdx.x / Q;
  const int q = blockIdx.x % Q, c = (int)(plane % C);
  const float m = ldp(rm[c]), rs = 1.f / sqrtf(ldp(rv[c]) + eps);
  if (plane < C && q == 0 && threadIdx.x == 0) { mean[c] = m; invstd[c] = rs; }
  kc_plane(y, x, plane, q, HWV, m, HAS_W ? rs * ldp(w[c]) : rs, HAS_B ? ldp(b[c]) : 0.f);
}
)CU";

struct BnGeom {
  int64_t n = 0, c = 0, hw = 0;
  DType x = DType::kF32, p = DType::kF32;   // input, parameters (weight, bias, running stats)
  bool training = true, has_w = false, has_b = false;
};

bool defined(const TensorMeta* t) { return t && t->defined; }

// The call's geometry; false when this template does not handle it (including training with
// running statistics, which would write the call's inputs: the dispatcher never keys one).
bool bn_geometry(const OpCall& c, BnGeom& g) {
  if (c.backend != BackendKind::kCuda || c.op != OpId::kBatchNorm || !c.dense() || c.outputs.size() != 3) return false;
  const TensorMeta* x = c.input("input");
  if (!x || !x->defined || !elem_dtype(x->dtype) || x->sizes.size() < 2 || x->numel() == 0 || !c.scalar("eps")) return false;
  g.x = g.p = x->dtype;
  g.n = x->sizes[0], g.c = x->sizes[1], g.hw = x->numel() / (g.n * g.c);
  g.training = c.int_arg("training", 1) != 0;
  const TensorMeta* rm = c.input("running_mean");
  const TensorMeta* rv = c.input("running_var");
  if (defined(rm) != defined(rv) || g.training == defined(rm)) return false;
  // fp32 counts in the Welford merges stay exact up to 2^24 elements a channel.
  if (g.n * g.hw > (int64_t{1} << 24) || g.c > INT_MAX || g.n * g.c > INT_MAX) return false;
  bool first = true;
  for (const char* nm : {"weight", "bias", "running_mean", "running_var"}) {
    const TensorMeta* t = c.input(nm);
    if (!defined(t)) continue;
    if (t->numel() != g.c || (t->dtype != g.x && t->dtype != DType::kF32) || (!first && t->dtype != g.p)) return false;
    g.p = t->dtype, first = false;   // one parameter dtype
  }
  g.has_w = defined(c.input("weight")), g.has_b = defined(c.input("bias"));
  if (!c.outputs[0].defined || c.outputs[0].dtype != g.x || c.outputs[0].sizes != x->sizes) return false;
  for (int i = 1; i < 3; ++i)
    if (!c.outputs[i].defined || c.outputs[i].dtype != DType::kF32 || c.outputs[i].numel() != g.c) return false;
  return true;
}


std::vector<KnobDim> bn_space(const BnGeom& g) {
  std::vector<KnobDim> sp;
  auto vecs = vec_values(g.x, g.hw);
  sp.push_back({"threads", {256, 128, 512, 1024, 64}});
  sp.push_back({"vec", with_default(vecs, vecs.back())});
  sp.push_back({"items", {4, 1, 2, 8}});
  if (g.training) sp.push_back({"bpc", channel_block_values(g.c, g.n * g.hw / vecs.back())});
  if (g.training) sp.push_back({"fuse", fuse_values(g.c, g.n * g.hw, dtype_size(g.x))});
  if (g.training) sp.push_back({"resident", resident_values()});
  if (g.training) sp.push_back({"regs", {0, 1}});   // the fused slice in registers
  return sp;
}

// Vectors a thread keeps of its fused slice (knob regs; 0: streamed, read twice).
int64_t bn_slice_items(const BnGeom& g, const Knobs& k) {
  const int64_t cl = k.count("fuse") ? k.at("fuse") : 0;
  if (cl == 0 || !k.count("regs") || !k.at("regs")) return 0;
  return slice_items(g.n * g.hw / k.at("vec"), cl, k.at("threads"));
}


// Constants, the parameter type and the optional weight / bias parameters.
std::string bn_consts(const BnGeom& g, const Knobs& k) {
  std::string s = "constexpr int NT = " + S(k.at("threads")) + ", G = NT, VEC = " + S(k.at("vec")) +
                  ", ITEMS = " + S(k.at("items")) + ", RI = " + S(bn_slice_items(g, k)) + ";\n";
  return s + cluster_consts(k.count("fuse") ? k.at("fuse") : 0) + affine_prelude(g.p, g.has_w, g.has_b);
}

class BatchNormTemplate : public Template {
 public:
  const char* name() const override { return "cuda.batch_norm"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    BnGeom g;
    return bn_geometry(c, g) ? bn_space(g) : std::vector<KnobDim>{};
  }

  // The fused launch at one or two wide blocks per SM, so that its slices fit L2 ("resident").
  std::vector<Knobs> seeds(const OpCall& c) const override {
    BnGeom g;
    if (!bn_geometry(c, g) || !g.training) return {};
    std::vector<Knobs> out = {{{"threads", 1024}, {"resident", 1}}, {{"threads", 512}, {"resident", 2}}};
    // Then the slice in registers, so a wave of SMs reads its slices from DRAM once without
    // relying on L2.
    for (Knobs& k : register_slice_seeds(g.c, g.n * g.hw, dtype_size(g.x), vec_values(g.x, g.hw).back())) out.push_back(k);
    return out;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    BnGeom g;
    if (!bn_geometry(c, g)) return unsupported("cuda.batch_norm does not handle this call");
    auto kr = pick(bn_space(g), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const int64_t vec = k["vec"], nt = k["threads"], items = k["items"];
    if (g.hw % vec != 0) return unsupported("vec " + S(vec) + " does not divide HxW (" + S(g.hw) + ")");
    const int64_t pieces = cdiv(g.hw / vec, items * nt);
    if (g.n * g.c * pieces > INT_MAX) return unsupported("too many plane pieces for one grid");
    if (g.training && k.at("resident") > 0 && k.at("fuse") == 0)
      return unsupported("resident caps the fused launch only");
    if (g.training && k.at("fuse") == 0) k["regs"] = 0;   // registers hold a fused slice only
    if (const int64_t ri = bn_slice_items(g, k); !slice_fits(ri, vec, nt))
      return unsupported("a slice of " + S(ri) + " vectors a thread does not fit " + S(nt) + " threads' registers");
    const std::string src = "// kernelcraft cuda.batch_norm " + std::string(dtype_name(g.x)) + " params " +
                            dtype_name(g.p) + (g.training ? " training" : " eval") + "\n" + dtype_prelude(g.x) +
                            bn_consts(g, k) + kGroupHelpers + kFusedNormHelpers + kBnBody;
    auto [ls, scratch] = launches(g, k);
    return make_candidate(name(), std::move(k), src, std::move(ls), std::move(scratch));
  }

 private:
  // The launch list and scratch of a setting; sizes are expressions over the input.
  static std::pair<json, json> launches(const BnGeom& g, const Knobs& k) {
    const int64_t vec = k.at("vec"), nt = k.at("threads"), items = k.at("items");
    const std::string C = "size(input,1)", HW = "numel(input) / (size(input,0) * size(input,1))";
    const std::string HWV = "(" + HW + ") / " + S(vec), TOTV = "numel(input) / size(input,1) / " + S(vec);
    const std::string Q = "ceil_div(" + HWV + ", " + S(items * nt) + ")";
    const std::string grid = "size(input,0) * size(input,1) * " + Q;
    std::vector<std::string> wb;
    if (g.has_w) wb.push_back("ptr:weight");
    if (g.has_b) wb.push_back("ptr:bias");
    json ls = json::array();
    if (!g.training) {
      std::vector<std::string> a = {"ptr:out0", "ptr:out1", "ptr:out2", "ptr:input"};
      a.insert(a.end(), wb.begin(), wb.end());
      a.insert(a.end(), {"ptr:running_mean", "ptr:running_var", "i32:" + C, "i64:" + HWV, "i32:" + Q, "f32:eps"});
      ls.push_back(launch("kc_bn_eval", {grid}, {nt}, a));
      return {ls, json()};
    }
    if (const int64_t cl = k.at("fuse"); cl > 0) {
      std::vector<std::string> a = {"ptr:out0", "ptr:out1", "ptr:out2", "ptr:part", "ptr:input"};
      a.insert(a.end(), wb.begin(), wb.end());
      a.insert(a.end(), {"i32:" + C, "i64:" + HWV, "i64:" + TOTV, "f32:eps"});
      ls.push_back(launch("kc_bn_fused", {C + " * " + S(cl)}, {nt}, a));
      ls.back()["smem"] = reserve_smem(k.at("resident"));
      return {ls, json::array({{{"name", "part"}, {"bytes", C + " * " + S(cl) + " * 8"}}})};
    }
    const std::string P = S(k.at("bpc"));
    ls.push_back(launch("kc_bn_stats", {C + " * " + P}, {nt}, {"ptr:part", "ptr:input", "i32:" + C, "i64:" + HWV, "i64:" + TOTV, "i32:" + P}));
    std::vector<std::string> f = {"ptr:out1", "ptr:out2", "ptr:ss", "ptr:part"};
    f.insert(f.end(), wb.begin(), wb.end());
    f.insert(f.end(), {"i64:" + TOTV, "i32:" + P, "f32:eps"});
    ls.push_back(launch("kc_bn_finalize", {C}, {nt}, f));
    ls.push_back(launch("kc_bn_apply", {grid}, {nt}, {"ptr:out0", "ptr:input", "ptr:ss", "i32:" + C, "i64:" + HWV, "i32:" + Q}));
    json scratch = json::array({{{"name", "part"}, {"bytes", C + " * " + P + " * 8"}}, {{"name", "ss"}, {"bytes", C + " * 12"}}});
    return {ls, scratch};
  }
};

}  // namespace

const Template* cuda_batch_norm_template() {
  static const BatchNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
