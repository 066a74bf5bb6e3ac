// CUDA global average pooling template (cuda.pool_global): _adaptive_avg_pool2d/3d with a 1x1
// (1x1x1) output, the head of ResNet-style networks. That is a row reduction, one mean over the
// T*H*W elements of each (n, c) plane, so it takes the row templates' shape rather than the window
// kernel's (one thread per output would read a whole plane alone): a warp (threads = 32, `rows`
// warps a block) or a block per plane, vector loads of `vec` elements (vec divides the plane, so
// every plane starts aligned), fp32 sums combined by shuffles (kGroupHelpers). f32 / f16 / bf16,
// dense tensors.
#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// Two independent partial sums a thread (every other vector), so consecutive loads do not wait
// on one add chain; the order is fixed, so the result is the same on every run.
const char* kGlobalBody = R"CU(
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, const T* __restrict__ x, long long rows,
                                                         long long L) {
  __shared__ float sh[64];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  const V* __restrict__ xv = reinterpret_cast<const V*>(x + row * L);
  const long long nv = L / VEC;
  float a0 = 0.f, a1 = 0.f;
  long long i = t;
  for (; i + G < nv; i += 2 * G) {
    const V u = xv[i], w = xv[i + G];
#pragma unroll
    for (int e = 0; e < VEC; ++e) { a0 += ld(u.v[e]); a1 += ld(w.v[e]); }
  }
  if (i < nv) {
    const V u = xv[i];
#pragma unroll
    for (int e = 0; e < VEC; ++e) a0 += ld(u.v[e]);
  }
  const float s = kc_gsum(a0 + a1, sh);
  if (t == 0) out[row] = st(s / (float)L);
}
)CU";

class PoolGlobalTemplate : public Template {
 public:
  const char* name() const override { return "cuda.pool_global"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    int64_t L = 0;
    if (!handles(c, L)) return {};
    std::vector<KnobDim> sp;
    row_space(sp, c.inputs[0].dtype, L, false);
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.pool_global does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    int64_t L = 0;
    handles(c, L);
    auto gr = row_geom(k, L);
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    const DType dt = c.inputs[0].dtype;
    const std::string entry = "kc_global_avg_pool";
    std::string src = "// kernelcraft cuda.pool_global " + entry + " " + dtype_name(dt) + "\n" + dtype_prelude(dt) +
                      row_consts(r) + kGroupHelpers + with_entry(kGlobalBody, entry);
    std::vector<std::string> args = {"ptr:out0", "ptr:self", "i64:numel(out0)", "i64:numel(self) / numel(out0)"};
    return make_candidate(name(), std::move(k), std::move(src),
                          json::array({launch(entry, {row_grid(r, "numel(out0)")}, {r.g * r.rpb}, args)}));
  }

 private:
  // L: the plane's length T*H*W.
  static bool handles(const OpCall& c, int64_t& L) {
    if (c.backend != BackendKind::kCuda || (c.op != OpId::kAdaptiveAvgPool2d && c.op != OpId::kAdaptiveAvgPool3d)) return false;
    if (!c.dense() || c.inputs.empty() || !elem_dtype(c.inputs[0].dtype) || c.inputs[0].numel() == 0) return false;
    auto g = pool_geometry(c);
    if (!g.is_ok() || !g->global()) return false;
    if (c.outputs.size() != 1 || !c.outputs[0].defined || c.outputs[0].dtype != c.inputs[0].dtype) return false;
    L = g->in[0] * g->in[1] * g->in[2];
    return g->planes <= INT_MAX && L <= (int64_t{1} << 40);
  }
};

}  // namespace

const Template* cuda_pool_global_template() {
  static const PoolGlobalTemplate t;
  return &t;
}

}  // namespace kc::evolve
