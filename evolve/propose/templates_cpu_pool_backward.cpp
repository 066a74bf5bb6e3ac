// CPU pooling backward template (cpu.pool_backward): max_pool2d/3d_with_indices_backward,
// avg_pool2d/3d_backward and _adaptive_avg_pool2d/3d_backward, fp32, dense. A gather: each input
// element sums grad_output over the windows that can hold it (pool.h pool_windows_of), max pooling
// only those whose saved index is this element, average pooling each term over its window's
// divisor. No atomics, no scatter: every element is written once by one block, in a fixed order,
// so results are the same however blocks are split over threads. A block is a run of input rows
// (plane, t, h). 2d is 3d with a one-deep t axis.
// Part of the CPU op-family templates (overview in templates_cpu.cpp).
#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// The outputs [lo, hi) whose window can hold input i of n along one axis (on outputs; ext the
// window's extent), and an average window's divisor factors: its padded and its clipped length.
const char* kRangeFns = R"K(static inline void kc_range(int64_t i, int64_t n, int64_t on, int64_t s, int64_t p, int64_t ext,
                             int64_t* lo, int64_t* hi) {
  if (KC_ADAPTIVE) {
    *lo = i * on / n;
    *hi = ((i + 1) * on + n - 1) / n;
    return;
  }
  *lo = i + p < ext ? 0 : (i + p - ext) / s + 1;
  const int64_t h = (i + p) / s + 1;
  *hi = h < on ? h : on;
}
static inline void kc_len(int64_t o, int64_t n, int64_t on, int64_t s, int64_t p, int64_t k, int64_t* padded,
                          int64_t* clipped) {
  if (KC_ADAPTIVE) {
    *padded = *clipped = ((o + 1) * n + on - 1) / on - o * n / on;
    return;
  }
  const int64_t l = o * s - p, h = l + k < n + p ? l + k : n + p;
  *padded = h - l;
  *clipped = (h < n ? h : n) - (l > 0 ? l : 0);
}
)K";

const char* kBody = R"K(  (void)divisor; (void)include_pad;   /* unused by max pooling */
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const int64_t h = r % IH, r2 = r / IH, t = r2 % IT, plane = r2 / IT;
      const int64_t ob = plane * OT * OH * OW;
      int64_t t0, t1, h0, h1;
      kc_range(t, IT, OT, sT, pT, eT, &t0, &t1);
      kc_range(h, IH, OH, sH, pH, eH, &h0, &h1);
      for (int64_t w = 0; w < IW; ++w) {
        int64_t w0, w1;
        kc_range(w, IW, OW, sW, pW, eW, &w0, &w1);
        kc_acc_t s = 0;
        for (int64_t ot = t0; ot < t1; ++ot)
          for (int64_t oh = h0; oh < h1; ++oh)
            for (int64_t ow = w0; ow < w1; ++ow) {
              const int64_t j = ob + (ot * OH + oh) * OW + ow;
@TERM@            }
        gi[r * IW + w] = (float)s;
      }
    }
  }
)K";

// Eager's index is plane-local: (t * IH + h) * IW + w.
const char* kMaxTerm = R"K(              if (idx[j] == (t * IH + h) * IW + w) s += (kc_acc_t)dy[j];
)K";

// The window's divisor as the forward used it: divisor_override, or its padded (count_include_pad)
// or clipped size; adaptive windows have no padding.
const char* kAvgTerm = R"K(              int64_t pt, ct, ph, ch, pw, cw;
              kc_len(ot, IT, OT, sT, pT, eT, &pt, &ct);
              kc_len(oh, IH, OH, sH, pH, eH, &ph, &ch);
              kc_len(ow, IW, OW, sW, pW, eW, &pw, &cw);
              const int64_t cnt = divisor ? divisor : include_pad ? pt * ph * pw : ct * ch * cw;
              s += (kc_acc_t)dy[j] / (kc_acc_t)cnt;
)K";

class PoolBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.pool_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    PoolGeom g;
    if (!handles(c, g)) return {};
    return {{"rows", rows_values(g.planes * g.in[0] * g.in[1], g.in[2])}, {"acc", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    PoolGeom g;
    handles(c, g);
    const std::string opname = op_info(c.op).name, entry = "kc_cpu_" + opname;
    Args a;
    a.ptr("float*", "gi", "out0");
    a.ptr("const float*", "dy", "grad_output");
    if (g.max) a.ptr("const int64_t*", "idx", "indices");
    a.i64("rows", "numel(self) / size(self,-1)");
    const bool d3 = g.nd == 3;
    a.i64("IT", d3 ? "size(self,-3)" : "1");
    a.i64("IH", "size(self,-2)");
    a.i64("IW", "size(self,-1)");
    a.i64("OT", d3 ? "size(grad_output,-3)" : "1");
    a.i64("OH", "size(grad_output,-2)");
    a.i64("OW", "size(grad_output,-1)");
    // The window lists per axis, as literal arguments (the spec cannot index a list scalar); the
    // extent is the dilated one for max pooling.
    const char* axes = "THW";
    for (int i = 0; i < 3; ++i) {
      const std::string ax(1, axes[i]);
      a.i64("k" + ax, str(g.k[i]));
      a.i64("s" + ax, str(g.s[i]));
      a.i64("p" + ax, str(g.p[i]));
      a.i64("e" + ax, str(g.max ? (g.k[i] - 1) * g.d[i] + 1 : g.k[i]));
    }
    a.i64("divisor", str(g.divisor));
    a.i64("include_pad", g.count_include_pad || g.adaptive ? "1" : "0");
    std::string body = replace_all(kBody, "@TERM@", g.max ? kMaxTerm : kAvgTerm);
    body = "  (void)kT; (void)kH; (void)kW;\n" + body;
    std::string src = head(name(), opname, k.value()) + "#define KC_ADAPTIVE " + (g.adaptive ? "1" : "0") + "\n" +
                      accumulators(k->at("acc") != 0) + kRangeFns + kernel(entry, a, body);
    const int64_t per = k->at("rows");
    json l = json::array({launch(entry, "ceil_div(numel(self) / size(self,-1), " + str(per) + ")", per, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  static bool handles(const OpCall& c, PoolGeom& g) {
    if (c.backend != BackendKind::kCpu || op_info(c.op).family != OpFamily::kPoolBackward || !c.dense()) return false;
    const TensorMeta* x = defined_input(c, "self");
    const TensorMeta* dy = defined_input(c, "grad_output");
    if (!x || !dy || x->dtype != DType::kF32 || dy->dtype != DType::kF32 || x->numel() <= 0) return false;
    auto r = pool_geometry(c);
    if (!r.is_ok()) return false;
    g = r.value();
    return c.outputs.size() == 1 && c.outputs[0].defined && c.outputs[0].dtype == DType::kF32;
  }
};

}  // namespace

const Template* cpu_pool_backward_template() {
  static const PoolBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
