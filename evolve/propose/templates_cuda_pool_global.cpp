// CUDA global average pooling template (cuda.pool_global): _adaptive_avg_pool2d/3d with a 1x1
// (1x1x1) output, the head of ResNet-style networks. That is a row reduction, one mean over the
// T*H*W elements of each (n, c) plane, so it takes the row templates' shape rather than the window
// kernel's (one thread per output would read a whole plane alone): a group of 4 to 16 lanes for
// short planes, a warp (threads = 32, `rows` warps a block) or a block per plane, vector loads of
// `vec` elements (vec divides the plane, so every plane starts aligned), fp32 sums combined by
// shuffles (kGroupHelpers). f32 / f16 / bf16, dense tensors.
#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// Four loads in flight a lane (consecutive loads do not wait on one add chain; the order is
// fixed, so the result is the same on every run). Groups of G < 32 lanes share a warp (short
// planes; kc_row_of).
const char* kGlobalBody = R"CU(
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, const T* __restrict__ x, long long rows,
                                                         long long L) {
  __shared__ float sh[64];
  int t;
  long long row;
  bool live;
  if (!kc_row_of(rows, t, row, live)) return;
  const V* __restrict__ xv = reinterpret_cast<const V*>(x + (live ? row : 0) * L);
  const long long nv = live ? L / VEC : 0;
  float a[4] = {0.f, 0.f, 0.f, 0.f};
  for (long long i = t; i < nv; i += 4 * G) {
    V u[4] = {};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k * G < nv) u[k] = xv[i + k * G];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e) a[k] += ld(u[k].v[e]);   // a missing vector is zeros
  }
  const float s = kc_gsum((a[0] + a[1]) + (a[2] + a[3]), sh);
  if (t == 0 && live) out[row] = st(s / (float)L);
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
    // Short planes (ResNet's 7x7 head): groups of 4 to 16 lanes, several planes a warp, each lane
    // about 6 vectors; a warp a plane of 49 floats had under two loads a lane in flight (0.77x
    // torch.compile on an H100, 13 us).
    const int64_t nv = L / sp[2].values.front();
    if (nv < 64) {
      const int64_t c6 = cdiv(nv, 6), g = std::clamp<int64_t>(pow2_ceil(c6 + 1) / 2, 4, 16);
      sp[0] = {"threads", with_default({4, 8, 16, 32, 64, 128, 256, 512, 1024}, g)};
      sp[1] = {"rows", with_default({1, 2, 4, 8}, 4)};
    }
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
                      row_consts(r) + kRowOf + kGroupHelpers + with_entry(kGlobalBody, entry);
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
