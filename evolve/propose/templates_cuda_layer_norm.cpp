// CUDA layer norm template (cuda.layer_norm).
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_norm.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Layer norm. Rows of N = prod(normalized_shape) elements, M rows. Strategy "split" = 0: a group
// (warp or block) per row; split = S > 0: every row is cut into S chunks, launch 1 writes each
// chunk's (mean, M2) into scratch, launch 2 has every block combine its row's partials (Chan,
// fixed order, so all blocks of a row agree bit for bit), normalise its chunk, and the chunk-0
// block writes mean and rstd. Inputs f32, bf16 or f16 (weight and bias in the input's dtype, as
// CUDA eager requires), vectors of up to 8 halves (16 bytes), fp32 arithmetic and statistics.


const char* kLnBody = R"CU(
__device__ __forceinline__ void kc_vstats(const KC_VECT& v, float& vm, float& vq) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) s += v.v[e];
  vm = s * (1.f / VEC);
  vq = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) { const float d = v.v[e] - vm; vq += d * d; }
}
__device__ __forceinline__ KC_VECT kc_norm(const KC_VECT& v, int i, float mu, float rs, const KC_ELEM* w, const KC_ELEM* b) {
  KC_VECT wv{}, bv{}, o;
  if constexpr (HAS_W) wv = reinterpret_cast<const KC_VECT*>(w)[i];
  if constexpr (HAS_B) bv = reinterpret_cast<const KC_VECT*>(b)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float r = (v.v[e] - mu) * rs;
    if constexpr (HAS_W) r = r * wv.v[e];
    if constexpr (HAS_B) r = r + bv.v[e];
    o.v[e] = r;
  }
  return o;
}
__device__ __forceinline__ int kc_chunk(int N, int S) { return ((N + S - 1) / S + VEC - 1) / VEC * VEC; }

extern "C" __global__ void __launch_bounds__(NT) kc_layer_norm(KC_ELEM* __restrict__ y, float* __restrict__ mean,
    float* __restrict__ rstd, const KC_ELEM* __restrict__ x KC_WB_PARAMS, long long M, int N, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* yv = reinterpret_cast<KC_VECT*>(y + row * N);
  const int nv = N / VEC;
  const float fN = (float)N;
  float mu, rs;
  if constexpr (ITEMS > 0) {
    // Corrected two-pass from registers: mean, then the deviations' sum (fixes the mean's rounding)
    // and squares.
    KC_VECT r[ITEMS > 0 ? ITEMS : 1];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        r[k] = xv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += r[k].v[e];
      }
    }
    s = kc_gsum(s, sh);
    mu = s / fN;
    float sd = 0.f, q = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
      if (k * G + t < nv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) { const float d = r[k].v[e] - mu; sd += d; q += d * d; }
    kc_gsum2(sd, q, sh);
    const float dm = sd / fN;
    mu += dm;
    rs = 1.f / sqrtf(fmaxf(q / fN - dm * dm, 0.f) + eps);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) yv[i] = kc_norm(r[k], i, mu, rs, w, b);
    }
  } else {
    KcW a{0.f, 0.f, 0.f};
    for (int i = t; i < nv; i += G) {
      float vm, vq;
      kc_vstats(xv[i], vm, vq);
      kc_wadd(a, (float)VEC, vm, vq);
    }
    kc_gwelford(a, sh);
    mu = a.m;
    rs = 1.f / sqrtf(fmaxf(a.q / fN, 0.f) + eps);
    for (int i = t; i < nv; i += G) yv[i] = kc_norm(xv[i], i, mu, rs, w, b);
  }
  if (t == 0) { mean[row] = mu; rstd[row] = rs; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_layer_norm_part(float* __restrict__ part, const KC_ELEM* __restrict__ x,
                                                                    long long M, int N, int S) {
  __shared__ float sh[96];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KcW a{0.f, 0.f, 0.f};
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) {
    float vm, vq;
    kc_vstats(xv[i], vm, vq);
    kc_wadd(a, (float)VEC, vm, vq);
  }
  kc_gwelford(a, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = a.m; part[2 * (long long)blockIdx.x + 1] = a.q; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_layer_norm_apply(KC_ELEM* __restrict__ y, float* __restrict__ mean,
    float* __restrict__ rstd, const KC_ELEM* __restrict__ x KC_WB_PARAMS, const float* __restrict__ part, long long M,
    int N, int S, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const float* pr = part + 2 * row * S;
  KcW a{0.f, 0.f, 0.f};
  for (int p = threadIdx.x; p < S; p += NT) {
    const long long n = min(C, max(0LL, (long long)N - p * C));
    kc_wadd(a, (float)n, pr[2 * p], pr[2 * p + 1]);
  }
  kc_gwelford(a, sh);
  const float mu = a.m, rs = 1.f / sqrtf(fmaxf(a.q / (float)N, 0.f) + eps);
  if (c == 0 && threadIdx.x == 0) { mean[row] = mu; rstd[row] = rs; }
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* yv = reinterpret_cast<KC_VECT*>(y + row * N);
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) yv[i] = kc_norm(xv[i], (int)i, mu, rs, w, b);
}
)CU";

class LayerNormTemplate : public Template {
 public:
  const char* name() const override { return "cuda.layer_norm"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    int64_t M, N;
    if (!handles(c, M, N)) return {};
    std::vector<KnobDim> sp;
    row_space(sp, c.input("input")->dtype, N, true);
    auto splits = split_values(M, N);
    if (splits.front() != 0) sp[0].values = with_default(sp[0].values, 256);   // block of the split kernels
    sp.push_back({"split", splits});
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.layer_norm does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    int64_t M = 0, N = 0;
    handles(c, M, N);
    const int64_t split = k["split"];
    if (split > 0) {   // the split kernels stream their chunk twice, one block a chunk
      k["regs"] = 0;
      k["rows"] = 1;
    }
    auto gr = row_geom(k, N);
    if (!gr.is_ok()) return gr.status();
    RowGeom r = gr.value();
    const bool hw = defined(c.input("weight")), hb = defined(c.input("bias"));
    const DType dt = c.input("input")->dtype;
    std::string src = "// kernelcraft cuda.layer_norm " + std::string(dtype_name(dt)) + "\n" + dtype_prelude(dt) +
                      row_consts(r) + "constexpr bool HAS_W = " + (hw ? "true" : "false") +
                      ", HAS_B = " + (hb ? "true" : "false") + ";\n" +
                      opt_params({{"w", hw}, {"b", hb}}, "KC_WB_PARAMS", "KC_WB_LOCALS", ln_elem(dt)) + kGroupHelpers +
                      ln_elem_prelude(dt) + ln_body(kLnBody, dt);
    const std::string Ms = "numel(out1)", Ns = "numel(input) / numel(out1)";
    std::vector<std::string> wb;
    if (hw) wb.push_back("ptr:weight");
    if (hb) wb.push_back("ptr:bias");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    json ls = json::array();
    json scratch = nullptr;
    if (split == 0) {
      ls.push_back(launch("kc_layer_norm", {row_grid(r, Ms)}, {r.g * r.rpb},
                          cat(cat({"ptr:out0", "ptr:out1", "ptr:out2", "ptr:input"}, wb),
                              {"i64:" + Ms, "i32:" + Ns, "f32:eps"})));
    } else {
      const std::string blocks = Ms + " * " + S(split);
      ls.push_back(launch("kc_layer_norm_part", {blocks}, {r.g}, {"ptr:part", "ptr:input", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split)}));
      ls.push_back(launch("kc_layer_norm_apply", {blocks}, {r.g},
                          cat(cat({"ptr:out0", "ptr:out1", "ptr:out2", "ptr:input"}, wb),
                              {"ptr:part", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split), "f32:eps"})));
      scratch = json::array({{{"name", "part"}, {"bytes", blocks + " * 8"}}});
    }
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls), std::move(scratch));
  }

 private:
  static bool defined(const TensorMeta* t) { return t && t->defined; }
  bool handles(const OpCall& c, int64_t& M, int64_t& N) const {
    if (c.backend != BackendKind::kCuda || c.op != OpId::kLayerNorm || !c.dense()) return false;
    if (!ln_geometry(c, M, N)) return false;
    const TensorMeta* x = c.input("input");
    if (!ln_param_ok(c.input("weight"), N, x->dtype) || !ln_param_ok(c.input("bias"), N, x->dtype)) return false;
    if (c.outputs.size() != 3) return false;
    // out0 in the input's dtype, mean and rstd in fp32 (CUDA's accumulate type for all three).
    if (!c.outputs[0].defined || c.outputs[0].dtype != x->dtype || c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (!c.outputs[i].defined || c.outputs[i].dtype != DType::kF32 || c.outputs[i].numel() != M) return false;
    return true;
  }
};

}  // namespace

const Template* cuda_layer_norm_template() {
  static const LayerNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
