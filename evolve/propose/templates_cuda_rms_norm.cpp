// CUDA fused RMSNorm forward (cuda.rms_norm): kernelcraft::rms_norm, out = x * rstd * w and the
// fp32 rstd (evolve/ops/rms_norm.h has the contract) in f32 / bf16 / f16, weight or none.
//
// Layer norm's forward without the mean: a group (a warp, RPB rows a block, or a block) owns a
// row, sums its squares in fp32 and writes each output rounded once. The row is read twice (sum,
// then outputs), so by default the group is the smallest whose registers hold the row in 16-byte
// vectors (templates_cuda_common.h cached_row_space): the data then moves once, 2 bytes read and
// 2 written an element for bf16, which on the H200 is bandwidth-bound (~4 TB/s). Rows too long
// for registers stream twice through 512 threads (the second read mostly from L2). Few rows
// ("split" = S > 0, default below 2 rows an SM): launch 1 writes each chunk's sum of squares into
// scratch, launch 2 has every block add its row's S partials in the same order (so all blocks of a
// row agree bit for bit), scale its chunk, and the chunk-0 block writes rstd. No atomics.
//
// Knobs: threads, rows, vec, regs (row registers), split. Element types through layer norm's
// KC_ELEM / KC_VECT (ln_body): fp32 math, halves read and rounded once.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_norm.h"
#include "evolve/propose/templates_rms_norm.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

const char* kRmsBody = R"CU(
__device__ __forceinline__ float kc_sq(const KC_VECT& v) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) { const float f = v.v[e]; s += f * f; }
  return s;
}
__device__ __forceinline__ KC_VECT kc_scale(const KC_VECT& v, int i, float rs, const KC_ELEM* w) {
  KC_VECT wv{}, o;
  if constexpr (HAS_W) wv = reinterpret_cast<const KC_VECT*>(w)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float r = v.v[e] * rs;
    if constexpr (HAS_W) r = r * wv.v[e];
    o.v[e] = r;
  }
  return o;
}
// eager: rsqrt(mean(x^2) + eps) in fp32; a correctly rounded sqrt and division (no fast math).
__device__ __forceinline__ float kc_rstd(float ss, int N, float eps) { return 1.f / sqrtf(ss / (float)N + eps); }
__device__ __forceinline__ int kc_chunk(int N, int S) { return ((N + S - 1) / S + VEC - 1) / VEC * VEC; }

extern "C" __global__ void __launch_bounds__(NT) kc_rms_norm(KC_ELEM* __restrict__ y, float* __restrict__ rstd,
    const KC_ELEM* __restrict__ x KC_W_PARAMS, long long M, int N, float eps) {
  KC_W_LOCALS
  __shared__ float sh[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* yv = reinterpret_cast<KC_VECT*>(y + row * N);
  const int nv = N / VEC;
  float s = 0.f, rs;
  if constexpr (ITEMS > 0) {
    KC_VECT r[ITEMS > 0 ? ITEMS : 1];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) { r[k] = xv[i]; s += kc_sq(r[k]); }
    }
    rs = kc_rstd(kc_gsum(s, sh), N, eps);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) yv[i] = kc_scale(r[k], i, rs, w);
    }
  } else {
    // Unrolled so a thread has several loads in flight (long rows are latency-bound otherwise).
#pragma unroll 4
    for (int i = t; i < nv; i += G) s += kc_sq(xv[i]);
    rs = kc_rstd(kc_gsum(s, sh), N, eps);
#pragma unroll 4
    for (int i = t; i < nv; i += G) yv[i] = kc_scale(xv[i], i, rs, w);
  }
  if (t == 0) rstd[row] = rs;
}

extern "C" __global__ void __launch_bounds__(NT) kc_rms_norm_part(float* __restrict__ part, const KC_ELEM* __restrict__ x,
                                                                  long long M, int N, int S) {
  __shared__ float sh[32];
  const long long row = blockIdx.x / S;
  const long long C = kc_chunk(N, S), lo = (blockIdx.x % S) * C, hi = min((long long)N, lo + C);
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  float s = 0.f;
#pragma unroll 4
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) s += kc_sq(xv[i]);
  s = kc_gsum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" __global__ void __launch_bounds__(NT) kc_rms_norm_apply(KC_ELEM* __restrict__ y, float* __restrict__ rstd,
    const KC_ELEM* __restrict__ x KC_W_PARAMS, const float* __restrict__ part, long long M, int N, int S, float eps) {
  KC_W_LOCALS
  __shared__ float sh[32];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S), lo = c * C, hi = min((long long)N, lo + C);
  float s = 0.f;
  for (int p = threadIdx.x; p < S; p += NT) s += part[row * S + p];
  const float rs = kc_rstd(kc_gsum(s, sh), N, eps);
  if (c == 0 && threadIdx.x == 0) rstd[row] = rs;
  const KC_VECT* xv = reinterpret_cast<const KC_VECT*>(x + row * N);
  KC_VECT* yv = reinterpret_cast<KC_VECT*>(y + row * N);
#pragma unroll 4
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) yv[i] = kc_scale(xv[i], (int)i, rs, w);
}
)CU";

class RmsNormTemplate : public Template {
 public:
  const char* name() const override { return "cuda.rms_norm"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    RmsCall f;
    if (!rms_call(c, BackendKind::kCuda, OpFamily::kRmsNorm, f)) return {};
    std::vector<KnobDim> sp;
    cached_row_space(sp, f.g.dt, f.g.cols, 512);
    auto splits = split_values(f.g.rows, f.g.cols);
    if (splits.front() != 0) {   // the split kernels: one block of 256 a chunk, streaming
      sp[0].values = with_default(sp[0].values, 256);
      sp[3].values = {0, 1};
    }
    sp.push_back({"split", splits});
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    RmsCall f;
    if (!rms_call(c, BackendKind::kCuda, OpFamily::kRmsNorm, f)) return unsupported("cuda.rms_norm does not handle this call");
    auto kr = pick(space(c), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const int64_t split = k.at("split");
    if (split > 0) {   // one block a chunk, streamed: rows and regs take their canonical values
      k["regs"] = 0;
      k["rows"] = 1;
    }
    auto gr = row_geom(k, f.g.cols);
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    const DType dt = f.g.dt;
    const bool hw = f.g.weighted;
    std::string src = "// kernelcraft cuda.rms_norm " + std::string(dtype_name(dt)) + "\n" + dtype_prelude(dt) +
                      row_consts(r) + "constexpr bool HAS_W = " + (hw ? "true" : "false") + ";\n" +
                      opt_params({{"w", hw}}, "KC_W_PARAMS", "KC_W_LOCALS", ln_elem(dt)) + kGroupHelpers +
                      ln_elem_prelude(dt) + ln_body(kRmsBody, dt);
    const std::string Ms = "numel(out1)", Ns = "numel(input) / numel(out1)";
    std::vector<std::string> head = {"ptr:out0", "ptr:out1", "ptr:input"};
    if (hw) head.push_back("ptr:weight");
    json ls = json::array(), scratch = nullptr;
    if (split == 0) {
      auto a = head;
      a.insert(a.end(), {"i64:" + Ms, "i32:" + Ns, "f32:eps"});
      ls.push_back(launch("kc_rms_norm", {row_grid(r, Ms)}, {r.g * r.rpb}, a));
    } else {
      const std::string blocks = Ms + " * " + S(split);
      ls.push_back(launch("kc_rms_norm_part", {blocks}, {r.g}, {"ptr:part", "ptr:input", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split)}));
      auto a = head;
      a.insert(a.end(), {"ptr:part", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split), "f32:eps"});
      ls.push_back(launch("kc_rms_norm_apply", {blocks}, {r.g}, a));
      scratch = json::array({{{"name", "part"}, {"bytes", blocks + " * 4"}}});
    }
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls), std::move(scratch));
  }
};

}  // namespace

const Template* cuda_rms_norm_template() {
  static const RmsNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
