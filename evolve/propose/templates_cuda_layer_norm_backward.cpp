// CUDA layer norm backward template (cuda.layer_norm_backward).
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_norm.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Layer norm backward. grad_input per row: gi = rstd/N * (N*w*g - xhat*sum(w*g*xhat) - sum(w*g)),
// by row groups or split rows (partial sums in scratch, then every block of a row adds them in
// the same order). grad_weight / grad_bias: column sums over rows, by blocks of 32 x col_ty
// threads, each over a range of rows (col_split ranges; partials in scratch and a finishing launch
// that adds them in order when col_split > 1). Deterministic: no atomics. bf16 / f16 calls (fp32
// mean and rstd, parameters and grads in the input's dtype, as CUDA eager) read and write halves
// but sum in fp32, partials included, and round each output once.

const char* kLnBackBody = R"CU(
__device__ __forceinline__ void kc_acc(const KC_VECT& g, const KC_VECT& x, int i, float mu, float rs, const KC_ELEM* w, float& a, float& b) {
  KC_VECT wv{};
  if constexpr (HAS_W) wv = reinterpret_cast<const KC_VECT*>(w)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float wg = HAS_W ? g.v[e] * wv.v[e] : g.v[e];
    a += wg;
    b += wg * ((x.v[e] - mu) * rs);
  }
}
__device__ __forceinline__ KC_VECT kc_gi(const KC_VECT& g, const KC_VECT& x, int i, float mu, float rs, const KC_ELEM* w, float a, float b, float fN) {
  KC_VECT wv{}, o;
  if constexpr (HAS_W) wv = reinterpret_cast<const KC_VECT*>(w)[i];
  const float term1 = (1.f / fN) * rs;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float f = HAS_W ? fN * wv.v[e] * g.v[e] : fN * g.v[e];
    f -= (x.v[e] - mu) * rs * b;
    f -= a;
    o.v[e] = f * term1;
  }
  return o;
}
__device__ __forceinline__ int kc_chunk(int N, int S) { return ((N + S - 1) / S + VEC - 1) / VEC * VEC; }

#if KC_GI
extern "C" __global__ void __launch_bounds__(NT) kc_lnb_rows(KC_ELEM* __restrict__ gi, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd KC_W_PARAMS, long long M, int N) {
  KC_W_LOCALS
  __shared__ float sh[64];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const float mu = mean[row], rs = rstd[row], fN = (float)N;
  const KC_VECT* gv = reinterpret_cast<const KC_VECT*>(g + row * N);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* ov = reinterpret_cast<KC_VECT*>(gi + row * N);
  const int nv = N / VEC;
  float a = 0.f, b = 0.f;
  if constexpr (ITEMS > 0) {
    KC_VECT rg[ITEMS > 0 ? ITEMS : 1], rx[ITEMS > 0 ? ITEMS : 1];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) { rg[k] = gv[i]; rx[k] = xv[i]; kc_acc(rg[k], rx[k], i, mu, rs, w, a, b); }
    }
    kc_gsum2(a, b, sh);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) ov[i] = kc_gi(rg[k], rx[k], i, mu, rs, w, a, b, fN);
    }
  } else {
    for (int i = t; i < nv; i += G) kc_acc(gv[i], xv[i], i, mu, rs, w, a, b);
    kc_gsum2(a, b, sh);
    for (int i = t; i < nv; i += G) ov[i] = kc_gi(gv[i], xv[i], i, mu, rs, w, a, b, fN);
  }
}

extern "C" __global__ void __launch_bounds__(NT) kc_lnb_part(float* __restrict__ part, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd KC_W_PARAMS, long long M,
    int N, int S) {
  KC_W_LOCALS
  __shared__ float sh[64];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const float mu = mean[row], rs = rstd[row];
  const KC_VECT* gv = reinterpret_cast<const KC_VECT*>(g + row * N);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  float a = 0.f, b = 0.f;
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) kc_acc(gv[i], xv[i], (int)i, mu, rs, w, a, b);
  kc_gsum2(a, b, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = a; part[2 * (long long)blockIdx.x + 1] = b; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_lnb_apply(KC_ELEM* __restrict__ gi, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd KC_W_PARAMS,
    const float* __restrict__ part, long long M, int N, int S) {
  KC_W_LOCALS
  __shared__ float sh[64];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const float mu = mean[row], rs = rstd[row], fN = (float)N;
  const float* pr = part + 2 * row * S;
  float a = 0.f, b = 0.f;
  for (int p = threadIdx.x; p < S; p += NT) { a += pr[2 * p]; b += pr[2 * p + 1]; }
  kc_gsum2(a, b, sh);
  const KC_VECT* gv = reinterpret_cast<const KC_VECT*>(g + row * N);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* ov = reinterpret_cast<KC_VECT*>(gi + row * N);
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) ov[i] = kc_gi(gv[i], xv[i], (int)i, mu, rs, w, a, b, fN);
}
#endif

#if KC_GW || KC_GB
struct alignas(sizeof(KC_ELEM) * CV) VC { KC_ELEM v[CV]; };
extern "C" __global__ void __launch_bounds__(32 * TY) kc_lnb_cols(KC_COL_OUT const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd, long long M, int N) {
  KC_COL_LOCALS
  __shared__ float shw[KC_GW ? TY : 1][32 * CV], shb[KC_GB ? TY : 1][32 * CV];
  const int jv = blockIdx.x * 32 + threadIdx.x;
  const long long rps = (M + KC_R - 1) / KC_R;
  const long long r0 = blockIdx.y * rps, r1 = min(M, r0 + rps);
  float aw[CV], ab[CV];
#pragma unroll
  for (int e = 0; e < CV; ++e) { aw[e] = 0.f; ab[e] = 0.f; }
  if (jv < N / CV) {
    for (long long i = r0 + threadIdx.y; i < r1; i += TY) {
      const VC gg = reinterpret_cast<const VC*>(g + i * N)[jv];
      if constexpr (KC_GW) {
        const float mu = mean[i], rs = rstd[i];
        const VC xx = reinterpret_cast<const VC*>(x + i * N)[jv];
#pragma unroll
        for (int e = 0; e < CV; ++e) aw[e] += gg.v[e] * ((xx.v[e] - mu) * rs);
      }
#pragma unroll
      for (int e = 0; e < CV; ++e) ab[e] += gg.v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < CV; ++e) {
    if constexpr (KC_GW) shw[threadIdx.y][threadIdx.x * CV + e] = aw[e];
    if constexpr (KC_GB) shb[threadIdx.y][threadIdx.x * CV + e] = ab[e];
  }
  __syncthreads();
  for (int q = threadIdx.y * 32 + threadIdx.x; q < 32 * CV; q += 32 * TY) {
    const long long j = (long long)blockIdx.x * 32 * CV + q;
    if (j < N) {
      float sw = 0.f, sb = 0.f;
      for (int ty = 0; ty < TY; ++ty) {
        if constexpr (KC_GW) sw += shw[ty][q];
        if constexpr (KC_GB) sb += shb[ty][q];
      }
      const long long o = (KC_R > 1 ? (long long)blockIdx.y * N : 0LL) + j;
      if constexpr (KC_GW) pw[o] = sw;
      if constexpr (KC_GB) pb[o] = sb;
    }
  }
}
#if KC_R > 1
extern "C" __global__ void __launch_bounds__(256) kc_lnb_colsum(KC_SUM_OUT int N) {
  KC_SUM_LOCALS
  const int j = blockIdx.x * 256 + threadIdx.x;
  if (j >= N) return;
  float sw = 0.f, sb = 0.f;
  for (int r = 0; r < KC_R; ++r) {
    if constexpr (KC_GW) sw += pw[(long long)r * N + j];
    if constexpr (KC_GB) sb += pb[(long long)r * N + j];
  }
  if constexpr (KC_GW) gw[j] = sw;
  if constexpr (KC_GB) gb[j] = sb;
}
#endif
#endif
)CU";

class LayerNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.layer_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    int64_t M, N;
    bool gi, gw, gb;
    if (!handles(c, M, N, gi, gw, gb)) return {};
    std::vector<KnobDim> sp;
    const DType dt = c.input("input")->dtype;
    if (gi) {
      row_space(sp, dt, N, true);
      auto splits = split_values(M, N);
      if (splits.front() != 0) sp[0].values = with_default(sp[0].values, 256);
      sp.push_back({"split", splits});
    }
    if (gw || gb) col_space(sp, dt, M, N, 4);
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.layer_norm_backward does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    int64_t M = 0, N = 0;
    bool gi = false, gw = false, gb = false;
    handles(c, M, N, gi, gw, gb);
    const bool hw = c.input("weight") && c.input("weight")->defined;
    RowGeom r;
    int64_t split = 0, ty = 1, cv = 1, rsplit = 1;
    if (gi) {
      split = k["split"];
      if (split > 0) {
        k["regs"] = 0;
        k["rows"] = 1;
      }
      auto gr = row_geom(k, N);
      if (!gr.is_ok()) return gr.status();
      r = gr.value();
    }
    if (gw || gb) {
      ty = k["col_ty"];
      cv = k["col_vec"];
      rsplit = k["col_split"];
      if (N % cv != 0) return unsupported("col_vec " + S(cv) + " does not divide the row (" + S(N) + ")");
      // Static shared memory: TY x 32 x CV floats per column sum (8 halves a thread reach 64 KiB).
      if ((gw + gb) * ty * 32 * cv * 4 > kMaxStaticShared)
        return unsupported("col_ty " + S(ty) + " x col_vec " + S(cv) + " needs over 48 KiB of shared memory");
    }
    const DType dt = c.input("input")->dtype;
    const std::string elem = ln_elem(dt);
    std::string src = "// kernelcraft cuda.layer_norm_backward " + std::string(dtype_name(dt)) + "\n" + dtype_prelude(dt) + row_consts(r) +
                      "constexpr bool HAS_W = " + (hw ? "true" : "false") + ";\nconstexpr int TY = " + S(ty) +
                      ", CV = " + S(cv) + ";\n#define KC_R " + S(rsplit) + "\n#define KC_GI " + S(gi) + "\n#define KC_GW " +
                      S(gw) + "\n#define KC_GB " + S(gb) + "\n" + opt_params({{"w", hw}}, "KC_W_PARAMS", "KC_W_LOCALS", elem);
    // Column kernels: outputs (or fp32 partials) first, absent ones replaced by null locals.
    const bool part = rsplit > 1;
    auto outs = [&](const char* m1, const char* m2, const std::string& w, const std::string& b) {
      std::string p = "#define " + std::string(m1), l = "#define " + std::string(m2);
      for (const auto& [n, on] : std::vector<std::pair<std::string, bool>>{{w, gw}, {b, gb}}) {
        if (on) p += " " + (part ? std::string("float") : elem) + "* __restrict__ " + n + ",";
        else l += " float* " + n + " = nullptr; (void)" + n + ";";
      }
      return p + "\n" + l + "\n";
    };
    src += outs("KC_COL_OUT", "KC_COL_LOCALS", "pw", "pb");
    if (part) {
      src += "#define KC_SUM_OUT";
      if (gw) src += " " + elem + "* __restrict__ gw,";
      if (gb) src += " " + elem + "* __restrict__ gb,";
      if (gw) src += " const float* __restrict__ pw,";
      if (gb) src += " const float* __restrict__ pb,";
      src += "\n#define KC_SUM_LOCALS";
      if (!gw) src += " float* gw = nullptr; const float* pw = nullptr; (void)gw; (void)pw;";
      if (!gb) src += " float* gb = nullptr; const float* pb = nullptr; (void)gb; (void)pb;";
      src += "\n";
    }
    src += std::string(kGroupHelpers) + ln_elem_prelude(dt) + ln_body(kLnBackBody, dt);

    const std::string Ms = "numel(mean)", Ns = "numel(input) / numel(mean)";
    std::vector<std::string> common = {"ptr:grad_out", "ptr:input", "ptr:mean", "ptr:rstd"};
    if (hw) common.push_back("ptr:weight");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    json ls = json::array(), scratch = json::array();
    if (gi && split == 0) {
      ls.push_back(launch("kc_lnb_rows", {row_grid(r, Ms)}, {r.g * r.rpb},
                          cat(cat({"ptr:out0"}, common), {"i64:" + Ms, "i32:" + Ns})));
    } else if (gi) {
      const std::string blocks = Ms + " * " + S(split);
      ls.push_back(launch("kc_lnb_part", {blocks}, {r.g}, cat(cat({"ptr:part"}, common), {"i64:" + Ms, "i32:" + Ns, "i32:" + S(split)})));
      ls.push_back(launch("kc_lnb_apply", {blocks}, {r.g},
                          cat(cat({"ptr:out0"}, common), {"ptr:part", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split)})));
      scratch.push_back({{"name", "part"}, {"bytes", blocks + " * 8"}});
    }
    if (gw || gb) {
      std::vector<std::string> o;
      if (gw) o.push_back(part ? "ptr:pw" : "ptr:out1");
      if (gb) o.push_back(part ? "ptr:pb" : "ptr:out2");
      ls.push_back(launch("kc_lnb_cols", {"ceil_div(" + Ns + ", " + S(32 * cv) + ")", rsplit}, {32, ty},
                          cat(o, {"ptr:grad_out", "ptr:input", "ptr:mean", "ptr:rstd", "i64:" + Ms, "i32:" + Ns})));
      if (part) {
        std::vector<std::string> a;
        if (gw) a.push_back("ptr:out1");
        if (gb) a.push_back("ptr:out2");
        if (gw) a.push_back("ptr:pw");
        if (gb) a.push_back("ptr:pb");
        a.push_back("i32:" + Ns);
        ls.push_back(launch("kc_lnb_colsum", {"ceil_div(" + Ns + ", 256)"}, {256}, a));
        if (gw) scratch.push_back({{"name", "pw"}, {"bytes", S(rsplit * 4) + " * " + Ns}});
        if (gb) scratch.push_back({{"name", "pb"}, {"bytes", S(rsplit * 4) + " * " + Ns}});
      }
    }
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls),
                          scratch.empty() ? json(nullptr) : std::move(scratch));
  }

 private:
  bool handles(const OpCall& c, int64_t& M, int64_t& N, bool& gi, bool& gw, bool& gb) const {
    if (c.backend != BackendKind::kCuda || c.op != OpId::kLayerNormBackward || !c.dense()) return false;
    if (!ln_geometry(c, M, N)) return false;
    const TensorMeta* x = c.input("input");
    const TensorMeta* g = c.input("grad_out");
    if (!tensor_ok(g, x->dtype) || g->sizes != x->sizes) return false;
    // mean and rstd in fp32 (CUDA's accumulate type for f32, bf16 and f16).
    for (const char* s : {"mean", "rstd"}) {
      const TensorMeta* t = c.input(s);
      if (!tensor_ok(t, DType::kF32) || t->numel() != M) return false;
    }
    if (!ln_param_ok(c.input("weight"), N, x->dtype)) return false;
    if (c.outputs.size() != 3) return false;
    gi = c.outputs[0].defined;
    gw = c.outputs[1].defined;
    gb = c.outputs[2].defined;
    if (!gi && !gw && !gb) return false;
    if (gi && (c.outputs[0].dtype != x->dtype || c.outputs[0].sizes != x->sizes)) return false;
    for (int i = 1; i < 3; ++i)   // grad_weight and grad_bias in the parameters' (the input's) dtype
      if (c.outputs[i].defined && (c.outputs[i].dtype != x->dtype || c.outputs[i].numel() != N)) return false;
    return true;
  }
};

}  // namespace

const Template* cuda_layer_norm_backward_template() {
  static const LayerNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
