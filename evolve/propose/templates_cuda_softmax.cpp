// CUDA softmax / log_softmax templates and their backward (cuda.softmax, cuda.softmax_backward).
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h.
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Softmax / log_softmax over the last dimension, and their backward.

// exp and the final division. Precise: expf and an IEEE division. Fast math (knob `math`, 16-bit
// data only): the hardware exp2 approximation and an approximate division, about 2^-21 relative
// before the output is rounded to bf16 (2^-9) or fp16 (2^-12); outputs below about 1e-38 flush
// to 0. The static check refuses these intrinsics on fp32 data, where softmax is memory bound
// anyway; in 16 bits the precise exp and division are most of a row's instructions.
const char* kSoftmaxPrecise = R"CU(__device__ __forceinline__ float kc_exp(float x) { return expf(x); }
__device__ __forceinline__ float kc_div(float a, float s) { return a / s; }
)CU";
const char* kSoftmaxFast = R"CU(__device__ __forceinline__ float kc_exp(float x) { return __expf(x); }
__device__ __forceinline__ float kc_div(float a, float s) { return __fdividef(a, s); }   // 1 <= s <= L, or NaN
)CU";

// KEEP_EXP: a row held in registers (ITEMS) and summed after its max (not online) keeps each
// exp(x - m) of the sum in place of x, so the outputs divide it rather than compute it again:
// half the exps, and the same bits (the same expf of the same argument).
const char* kSoftmaxBody = R"CU(
constexpr bool KEEP_EXP = ITEMS > 0 && !ONLINE && !LOG;
// Online (max, sum) state: s is the sum of exp(x - m). An +inf or NaN input poisons s as eager's
// exp(inf - inf) / exp(NaN) would; -inf inputs add nothing.
__device__ __forceinline__ void kc_upd(float& m, float& s, float x) {
  if (x > m) { s = __fmul_rn(s, kc_exp(m - x)) + (x == KC_INF ? KC_NAN : 1.f); m = x; }
  else if (x != -KC_INF) s += kc_exp(x - m);
}
__device__ __forceinline__ void kc_merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  const float a = m == -KC_INF ? 0.f : __fmul_rn(s, kc_exp(m - mm));
  const float b = m2 == -KC_INF ? 0.f : __fmul_rn(s2, kc_exp(m2 - mm));
  m = mm;
  s = a + b;
}
__device__ __forceinline__ void kc_gmerge(float& m, float& s, float* shm, float* shs) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) kc_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) { shm[threadIdx.x >> 5] = m; shs[threadIdx.x >> 5] = s; }
    __syncthreads();
    m = shm[0];
    s = shs[0];
    for (int w = 1; w < G / 32; ++w) kc_merge(m, s, shm[w], shs[w]);
    __syncthreads();
  }
}
__device__ __forceinline__ float kc_out(float x, float m, float s, float ls) {
  if constexpr (LOG) return (x - m) - ls;
  else return kc_div(kc_exp(x - m), s);
}
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, const T* __restrict__ x, long long rows, int L) {
  __shared__ float sh_m[32], sh_s[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  const V* xv = reinterpret_cast<const V*>(x + row * L);
  V* ov = reinterpret_cast<V*>(out + row * L);
  const int nv = L / VEC;
  float m = -KC_INF, s = 0.f;
  float r[ITEMS > 0 ? ITEMS : 1][VEC];
  if constexpr (ITEMS > 0) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        const V v = xv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[k][e] = ld(v.v[e]);
      }
    }
    if constexpr (ONLINE) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (k * G + t < nv)
#pragma unroll
          for (int e = 0; e < VEC; ++e) kc_upd(m, s, r[k][e]);
      kc_gmerge(m, s, sh_m, sh_s);
    } else {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (k * G + t < nv)
#pragma unroll
          for (int e = 0; e < VEC; ++e) m = fmaxf(m, r[k][e]);
      m = kc_gmax(m, sh_m);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (k * G + t < nv)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float ex = kc_exp(r[k][e] - m);
            s += ex;
            if constexpr (KEEP_EXP) r[k][e] = ex;
          }
      s = kc_gsum(s, sh_s);
    }
  } else if constexpr (ONLINE) {
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) kc_upd(m, s, ld(v.v[e]));
    }
    kc_gmerge(m, s, sh_m, sh_s);
  } else {
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = fmaxf(m, ld(v.v[e]));
    }
    m = kc_gmax(m, sh_m);
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += kc_exp(ld(v.v[e]) - m);
    }
    s = kc_gsum(s, sh_s);
  }
  const float ls = LOG ? logf(s) : 0.f;
  if constexpr (ITEMS > 0) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(KEEP_EXP ? kc_div(r[k][e], s) : kc_out(r[k][e], m, s, ls));
        ov[i] = o;
      }
    }
  } else {
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_out(ld(v.v[e]), m, s, ls));
      ov[i] = o;
    }
  }
}
)CU";

// softmax: gi = y * (g - sum(g * y)); log_softmax: gi = g - exp(y) * sum(g).
const char* kSoftmaxBackBody = R"CU(
__device__ __forceinline__ float kc_dot(float g, float y) { if constexpr (LOG) return g; else return g * y; }
__device__ __forceinline__ float kc_gi(float g, float y, float d) {
  if constexpr (LOG) return g - expf(y) * d;
  else return y * (g - d);
}
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ gi, const T* __restrict__ g, const T* __restrict__ y,
                                                          long long rows, int L) {
  __shared__ float sh[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  const V* gv = reinterpret_cast<const V*>(g + row * L);
  const V* yv = reinterpret_cast<const V*>(y + row * L);
  V* ov = reinterpret_cast<V*>(gi + row * L);
  const int nv = L / VEC;
  float d = 0.f;
  if constexpr (ITEMS > 0) {
    V rg[ITEMS > 0 ? ITEMS : 1], ry[ITEMS > 0 ? ITEMS : 1];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        rg[k] = gv[i];
        ry[k] = yv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += kc_dot(ld(rg[k].v[e]), ld(ry[k].v[e]));
      }
    }
    d = kc_gsum(d, sh);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_gi(ld(rg[k].v[e]), ld(ry[k].v[e]), d));
        ov[i] = o;
      }
    }
  } else {
    for (int i = t; i < nv; i += G) {
      const V a = gv[i];
      if constexpr (LOG) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += ld(a.v[e]);
      } else {
        const V b = yv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += ld(a.v[e]) * ld(b.v[e]);
      }
    }
    d = kc_gsum(d, sh);
    for (int i = t; i < nv; i += G) {
      const V a = gv[i], b = yv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_gi(ld(a.v[e]), ld(b.v[e]), d));
      ov[i] = o;
    }
  }
}
)CU";

class SoftmaxTemplate : public Template {
 public:
  explicit SoftmaxTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cuda.softmax_backward" : "cuda.softmax"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    const TensorMeta* x = rowed(c);
    if (!x) return {};
    std::vector<KnobDim> sp;
    row_space(sp, x->dtype, x->sizes.back(), true);
    if (!backward_) sp.push_back({"online", {0, 1}});
    if (!backward_ && x->dtype != DType::kF32) sp.push_back({"math", {1, 0}});
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported(std::string(name()) + " does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const TensorMeta* x = rowed(c);
    auto gr = row_geom(k, x->sizes.back());
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    const bool log = c.op == OpId::kLogSoftmax || c.op == OpId::kLogSoftmaxBackward;
    const std::string entry = std::string(log ? "kc_log_softmax" : "kc_softmax") + (backward_ ? "_backward" : "");
    const bool fast = k.count("math") && k.at("math") == 1;
    std::string src = "// kernelcraft " + std::string(name()) + " " + entry + " " + dtype_name(x->dtype) +
                      (fast ? " fast math" : "") + "\n" + dtype_prelude(x->dtype) + row_consts(r) +
                      "constexpr bool LOG = " + (log ? "true" : "false") + ", ONLINE = " +
                      (!backward_ && k["online"] ? "true" : "false") + ";\n" + kGroupHelpers +
                      (backward_ ? "" : fast ? kSoftmaxFast : kSoftmaxPrecise) +
                      with_entry(backward_ ? kSoftmaxBackBody : kSoftmaxBody, entry);
    const std::string xn = backward_ ? "grad_output" : "self";
    const std::string rows = "numel(" + xn + ") / size(" + xn + ", -1)";
    std::vector<std::string> args = {"ptr:out0"};
    if (backward_) {
      args.push_back("ptr:grad_output");
      args.push_back("ptr:output");
    } else {
      args.push_back("ptr:self");
    }
    args.push_back("i64:" + rows);
    args.push_back("i32:size(" + xn + ", -1)");
    return make_candidate(name(), std::move(k), std::move(src),
                          json::array({launch(entry, {row_grid(r, rows)}, {r.g * r.rpb}, args)}));
  }

 private:
  // The input whose last dimension is reduced, when the call is one this template handles.
  const TensorMeta* rowed(const OpCall& c) const {
    if (c.backend != BackendKind::kCuda) return nullptr;
    const OpFamily fam = op_info(c.op).family;
    if (fam != (backward_ ? OpFamily::kSoftmaxBackward : OpFamily::kSoftmax)) return nullptr;
    if (!c.dense() || c.outputs.size() != 1) return nullptr;
    const TensorMeta* x = c.input(backward_ ? "grad_output" : "self");
    if (!x || !x->defined || !elem_dtype(x->dtype) || x->sizes.empty() || x->numel() == 0) return nullptr;
    const int64_t nd = static_cast<int64_t>(x->sizes.size());
    int64_t dim = c.int_arg("dim", -1);
    if (dim < 0) dim += nd;
    if (dim != nd - 1) return nullptr;
    const int64_t L = x->sizes.back();
    if (L > INT_MAX / 2 || x->numel() / L > INT_MAX) return nullptr;
    if (backward_) {
      const TensorMeta* y = c.input("output");
      if (!tensor_ok(y, x->dtype) || y->sizes != x->sizes) return nullptr;
      if (c.string_arg("input_dtype", dtype_name(x->dtype)) != dtype_name(x->dtype)) return nullptr;
    } else {
      const ScalarArg* h = c.scalar("half_to_float");
      if (h) {
        const bool* b = std::get_if<bool>(&h->value);
        const int64_t* i = std::get_if<int64_t>(&h->value);
        if ((b && *b) || (i && *i)) return nullptr;
      }
    }
    const TensorMeta& o = c.outputs[0];
    if (!o.defined || o.dtype != x->dtype || o.sizes != x->sizes) return nullptr;
    return x;
  }

  bool backward_;
};


}  // namespace

const Template* cuda_softmax_template(bool backward) {
  static const SoftmaxTemplate fwd(false), bwd(true);
  return backward ? &bwd : &fwd;
}

}  // namespace kc::evolve
