// CUDA fused RMSNorm backward (cuda.rms_norm_backward): kernelcraft::rms_norm_backward, grad_input
// and / or grad_weight (output_mask) from the forward's fp32 rstd (evolve/ops/rms_norm.h has the
// formulas) in f32 / bf16 / f16, weight or none.
//
// grad_input: a group per row, as the forward (cuda.rms_norm): one pass sums
// b = sum_k a_k xhat_k (a = g w, xhat = x rstd), the second writes rstd (a_j - xhat_j b / K),
// from registers by default (grad and input held: read once, grad_input written once), or with
// "split" chunks of a long row adding their partial sums from scratch in a fixed order. grad_weight:
// column sums of g * xhat over rows, layer norm backward's scheme (templates_cuda_layer_norm_
// backward.cpp): blocks of 32 x col_ty threads with col_vec columns a thread over col_split row
// ranges, fp32 partials in scratch and a finishing launch that adds them in range order when
// col_split > 1. Deterministic: no atomics. fp32 math, every output rounded once.
//
// Knobs: threads, rows, vec, regs, split (grad_input); col_ty, col_vec, col_split (grad_weight).
// Defaults: the forward's row geometry; for the columns 16-byte vectors, 8 warps a block and
// enough row ranges for ~2 blocks an SM while each range keeps at least 32 rows a warp.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_norm.h"
#include "evolve/propose/templates_rms_norm.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kRmsBackBody = R"CU(
__device__ __forceinline__ int kc_chunk(int N, int S) { return ((N + S - 1) / S + VEC - 1) / VEC * VEC; }
#if KC_GI
// b += sum over the vector of a_j xhat_j.
__device__ __forceinline__ void kc_dot(const KC_VECT& g, const KC_VECT& x, int i, float rs, const KC_ELEM* w, float& b) {
  KC_VECT wv{};
  if constexpr (HAS_W) wv = reinterpret_cast<const KC_VECT*>(w)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float a = HAS_W ? g.v[e] * wv.v[e] : (float)g.v[e];
    b += a * (x.v[e] * rs);
  }
}
// rstd (a_j - xhat_j * cb), cb = b / K.
__device__ __forceinline__ KC_VECT kc_gi(const KC_VECT& g, const KC_VECT& x, int i, float rs, const KC_ELEM* w, float cb) {
  KC_VECT wv{}, o;
  if constexpr (HAS_W) wv = reinterpret_cast<const KC_VECT*>(w)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float a = HAS_W ? g.v[e] * wv.v[e] : (float)g.v[e];
    o.v[e] = rs * (a - (x.v[e] * rs) * cb);
  }
  return o;
}

extern "C" __global__ void __launch_bounds__(NT) kc_rmsb_rows(KC_ELEM* __restrict__ gi, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ rstd KC_W_PARAMS, long long M, int N) {
  KC_W_LOCALS
  __shared__ float sh[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const float rs = rstd[row];
  const KC_VECT* gv = reinterpret_cast<const KC_VECT*>(g + row * N);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* ov = reinterpret_cast<KC_VECT*>(gi + row * N);
  const int nv = N / VEC;
  float b = 0.f;
  if constexpr (ITEMS > 0) {
    KC_VECT rg[ITEMS > 0 ? ITEMS : 1], rx[ITEMS > 0 ? ITEMS : 1];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) { rg[k] = gv[i]; rx[k] = xv[i]; kc_dot(rg[k], rx[k], i, rs, w, b); }
    }
    const float cb = kc_gsum(b, sh) / (float)N;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) ov[i] = kc_gi(rg[k], rx[k], i, rs, w, cb);
    }
  } else {
#pragma unroll 4
    for (int i = t; i < nv; i += G) kc_dot(gv[i], xv[i], i, rs, w, b);
    const float cb = kc_gsum(b, sh) / (float)N;
#pragma unroll 4
    for (int i = t; i < nv; i += G) ov[i] = kc_gi(gv[i], xv[i], i, rs, w, cb);
  }
}

extern "C" __global__ void __launch_bounds__(NT) kc_rmsb_part(float* __restrict__ part, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ rstd KC_W_PARAMS, long long M, int N, int S) {
  KC_W_LOCALS
  __shared__ float sh[32];
  const long long row = blockIdx.x / S;
  const long long C = kc_chunk(N, S), lo = (blockIdx.x % S) * C, hi = min((long long)N, lo + C);
  const float rs = rstd[row];
  const KC_VECT* gv = reinterpret_cast<const KC_VECT*>(g + row * N);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  float b = 0.f;
#pragma unroll 4
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) kc_dot(gv[i], xv[i], (int)i, rs, w, b);
  b = kc_gsum(b, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = b;
}

extern "C" __global__ void __launch_bounds__(NT) kc_rmsb_apply(KC_ELEM* __restrict__ gi, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ rstd KC_W_PARAMS, const float* __restrict__ part, long long M,
    int N, int S) {
  KC_W_LOCALS
  __shared__ float sh[32];
  const long long row = blockIdx.x / S;
  const long long C = kc_chunk(N, S), lo = (blockIdx.x % S) * C, hi = min((long long)N, lo + C);
  const float rs = rstd[row];
  float b = 0.f;
  for (int p = threadIdx.x; p < S; p += NT) b += part[row * S + p];
  const float cb = kc_gsum(b, sh) / (float)N;
  const KC_VECT* gv = reinterpret_cast<const KC_VECT*>(g + row * N);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* ov = reinterpret_cast<KC_VECT*>(gi + row * N);
#pragma unroll 4
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) ov[i] = kc_gi(gv[i], xv[i], (int)i, rs, w, cb);
}
#endif

#if KC_GW
// Column sums of g * xhat: a thread owns CV columns over its block's row range (rows TY apart),
// the TY warps' sums are added in warp order through shared memory. KC_R > 1: fp32 partials, one
// row of N a range, added in range order by kc_rmsb_colsum.
struct alignas(sizeof(KC_ELEM) * CV) VC { KC_ELEM v[CV]; };
extern "C" __global__ void __launch_bounds__(32 * TY) kc_rmsb_cols(KC_PW* __restrict__ pw, const KC_ELEM* __restrict__ g,
    const KC_ELEM* __restrict__ x, const float* __restrict__ rstd, long long M, int N) {
  __shared__ float sh[TY][32 * CV];
  const int jv = blockIdx.x * 32 + threadIdx.x;
  const long long rps = (M + KC_R - 1) / KC_R;
  const long long r0 = blockIdx.y * rps, r1 = min(M, r0 + rps);
  float acc[CV];
#pragma unroll
  for (int e = 0; e < CV; ++e) acc[e] = 0.f;
  if (jv < N / CV) {
#pragma unroll 4
    for (long long i = r0 + threadIdx.y; i < r1; i += TY) {
      const VC gg = reinterpret_cast<const VC*>(g + i * N)[jv];
      const VC xx = reinterpret_cast<const VC*>(x + i * N)[jv];
      const float rs = rstd[i];
#pragma unroll
      for (int e = 0; e < CV; ++e) acc[e] += gg.v[e] * (xx.v[e] * rs);
    }
  }
#pragma unroll
  for (int e = 0; e < CV; ++e) sh[threadIdx.y][threadIdx.x * CV + e] = acc[e];
  __syncthreads();
  for (int q = threadIdx.y * 32 + threadIdx.x; q < 32 * CV; q += 32 * TY) {
    const long long j = (long long)blockIdx.x * 32 * CV + q;
    if (j >= N) continue;
    float s = 0.f;
    for (int ty = 0; ty < TY; ++ty) s += sh[ty][q];
    pw[(KC_R > 1 ? (long long)blockIdx.y * N : 0LL) + j] = s;
  }
}
#if KC_R > 1
extern "C" __global__ void __launch_bounds__(256) kc_rmsb_colsum(KC_ELEM* __restrict__ gw, const float* __restrict__ pw, int N) {
  const int j = blockIdx.x * 256 + threadIdx.x;
  if (j >= N) return;
  float s = 0.f;
  for (int r = 0; r < KC_R; ++r) s += pw[(long long)r * N + j];
  gw[j] = s;
}
#endif
#endif
)CU";

class RmsNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.rms_norm_backward"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    RmsCall f;
    if (!rms_call(c, BackendKind::kCuda, OpFamily::kRmsNormBackward, f)) return {};
    const int64_t M = f.g.rows, N = f.g.cols;
    std::vector<KnobDim> sp;
    if (f.g.want_input) {
      cached_row_space(sp, f.g.dt, N, 512);
      auto splits = split_values(M, N);
      if (splits.front() != 0) {   // the split kernels: one block of 256 a chunk, streaming
        sp[0].values = with_default(sp[0].values, 256);
        sp[3].values = {0, 1};
      }
      sp.push_back({"split", splits});
    }
    if (f.g.want_weight) col_space(sp, f.g.dt, M, N, 32);   // layer norm backward's column geometry
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    RmsCall f;
    if (!rms_call(c, BackendKind::kCuda, OpFamily::kRmsNormBackward, f))
      return unsupported("cuda.rms_norm_backward does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const bool gi = f.g.want_input, gw = f.g.want_weight, hw = f.g.weighted;
    const int64_t N = f.g.cols;
    RowGeom r;
    int64_t split = 0, ty = 1, cv = 1, rsplit = 1;
    if (gi) {
      split = k.at("split");
      if (split > 0) {   // one block a chunk, streamed: rows and regs take their canonical values
        k["regs"] = 0;
        k["rows"] = 1;
      }
      auto gr = row_geom(k, N);
      if (!gr.is_ok()) return gr.status();
      r = gr.value();
    }
    if (gw) {
      ty = k.at("col_ty");
      cv = k.at("col_vec");
      rsplit = k.at("col_split");
      if (N % cv != 0) return unsupported("col_vec " + S(cv) + " does not divide the row (" + S(N) + ")");
      if (ty * 32 * cv * 4 > kMaxStaticShared) return unsupported("col_ty x col_vec needs over 48 KiB of shared memory");
    }
    return make_candidate(name(), std::move(k), source(f.g.dt, r, hw, gi, gw, ty, cv, rsplit),
                          launches(f, r, split, ty, cv, rsplit), scratch(gi, gw, split, rsplit));
  }

 private:
  static std::string source(DType dt, const RowGeom& r, bool hw, bool gi, bool gw, int64_t ty, int64_t cv, int64_t rsplit) {
    const std::string elem = ln_elem(dt);
    return "// kernelcraft cuda.rms_norm_backward " + std::string(dtype_name(dt)) + "\n" + dtype_prelude(dt) +
           row_consts(r) + "constexpr bool HAS_W = " + (hw ? "true" : "false") + ";\nconstexpr int TY = " + S(ty) +
           ", CV = " + S(cv) + ";\n#define KC_R " + S(rsplit) + "\n#define KC_GI " + S(gi) + "\n#define KC_GW " + S(gw) +
           "\n#define KC_PW " + (rsplit > 1 ? std::string("float") : elem) + "\n" +
           opt_params({{"w", hw}}, "KC_W_PARAMS", "KC_W_LOCALS", elem) + kGroupHelpers + ln_elem_prelude(dt) +
           ln_body(kRmsBackBody, dt);
  }

  static json launches(const RmsCall& f, const RowGeom& r, int64_t split, int64_t ty, int64_t cv, int64_t rsplit) {
    const std::string Ms = "numel(rstd)", Ns = "numel(input) / numel(rstd)";
    std::vector<std::string> common = {"ptr:grad", "ptr:input", "ptr:rstd"};
    if (f.g.weighted) common.push_back("ptr:weight");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    json ls = json::array();
    if (f.g.want_input && split == 0) {
      ls.push_back(launch("kc_rmsb_rows", {row_grid(r, Ms)}, {r.g * r.rpb}, cat(cat({"ptr:out0"}, common), {"i64:" + Ms, "i32:" + Ns})));
    } else if (f.g.want_input) {
      const std::string blocks = Ms + " * " + S(split);
      ls.push_back(launch("kc_rmsb_part", {blocks}, {r.g}, cat(cat({"ptr:part"}, common), {"i64:" + Ms, "i32:" + Ns, "i32:" + S(split)})));
      ls.push_back(launch("kc_rmsb_apply", {blocks}, {r.g},
                          cat(cat({"ptr:out0"}, common), {"ptr:part", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split)})));
    }
    if (f.g.want_weight) {
      ls.push_back(launch("kc_rmsb_cols", {"ceil_div(" + Ns + ", " + S(32 * cv) + ")", rsplit}, {32, ty},
                          {rsplit > 1 ? "ptr:pw" : "ptr:out1", "ptr:grad", "ptr:input", "ptr:rstd", "i64:" + Ms, "i32:" + Ns}));
      if (rsplit > 1)
        ls.push_back(launch("kc_rmsb_colsum", {"ceil_div(" + Ns + ", 256)"}, {256}, {"ptr:out1", "ptr:pw", "i32:" + Ns}));
    }
    return ls;
  }

  static json scratch(bool gi, bool gw, int64_t split, int64_t rsplit) {
    json s = json::array();
    if (gi && split > 0) s.push_back({{"name", "part"}, {"bytes", "numel(rstd) * " + S(split) + " * 4"}});
    if (gw && rsplit > 1) s.push_back({{"name", "pw"}, {"bytes", S(rsplit * 4) + " * numel(input) / numel(rstd)"}});
    return s.empty() ? json(nullptr) : s;
  }
};

}  // namespace

const Template* cuda_rms_norm_backward_template() {
  static const RmsNormBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
