// CPU pooling template (cpu.pool): max_pool2d/3d_with_indices (and max_pool2d/3d_values, no index
// output), avg_pool2d/3d and _adaptive_avg_pool2d/3d, fp32, dense.
// A block is a run of output rows (plane, t, h); each output scans its window in (t, h, w) order,
// so results are the same however blocks are split over threads. 2d is 3d with a one-deep t axis.
// Part of the CPU op-family templates (overview in templates_cpu.cpp).
#include "evolve/ops/pool.h"
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// The window of output o along one axis, as eager forms it: max steps a start in the padding by
// whole dilations to the first tap inside; avg counts the padded extent (count_include_pad), then
// clips to the input.
const char* kWindowFn = R"K(static inline void kc_win(int64_t o, int64_t s, int64_t p, int64_t k, int64_t d, int64_t n,
                           int64_t* lo, int64_t* hi, int64_t* padded) {
  int64_t l = o * s - p, h;
  if (KC_MAX) {
    h = l + (k - 1) * d + 1 < n ? l + (k - 1) * d + 1 : n;
    if (l < 0) l += ((-l + d - 1) / d) * d;
    *padded = 0;
  } else {
    h = l + k < n + p ? l + k : n + p;
    *padded = h - l;
    if (l < 0) l = 0;
    if (h > n) h = n;
  }
  *lo = l;
  *hi = h;
}
)K";

// Adaptive windows [floor(o n / on), ceil((o + 1) n / on)), the same signature with the output
// count in the stride's slot (adaptive renders pass it there), so the body serves both and the
// max / avg sources stay byte for byte what they were.
const char* kAdaptiveWindowFn = R"K(static inline void kc_win(int64_t o, int64_t on, int64_t p, int64_t k, int64_t d,
                           int64_t n, int64_t* lo, int64_t* hi, int64_t* padded) {
  (void)p; (void)k; (void)d;
  *lo = o * n / on;
  *hi = ((o + 1) * n + on - 1) / on;
  *padded = *hi - *lo;
}
)K";

const char* kPoolBody = R"K(  (void)divisor; (void)include_pad; (void)dT; (void)dH; (void)dW;   /* unused by one of max / avg */
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const int64_t oh = r % OH, r2 = r / OH, ot = r2 % OT, plane = r2 / OT;
      const float* xp = in + plane * IT * IH * IW;
      int64_t t0, t1, tn, h0, h1, hn;
      kc_win(ot, sT, pT, kT, dT, IT, &t0, &t1, &tn);
      kc_win(oh, sH, pH, kH, dH, IH, &h0, &h1, &hn);
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t w0, w1, wn;
        kc_win(ow, sW, pW, kW, dW, IW, &w0, &w1, &wn);
@OUTPUT@      }
    }
  }
)K";

// First index on ties (strictly greater); a NaN replaces anything, so the last NaN wins.
const char* kMaxOut = R"K(        float m = -INFINITY;
        int64_t bi = (t0 * IH + h0) * IW + w0;
        for (int64_t t = t0; t < t1; t += dT)
          for (int64_t h = h0; h < h1; h += dH)
            for (int64_t w = w0; w < w1; w += dW) {
              const int64_t i = (t * IH + h) * IW + w;
              const float v = xp[i];
              if (v > m || v != v) { m = v; bi = i; }
            }
        out[r * OW + ow] = m;
@IDX_STORE@)K";

const char* kAvgOut = R"K(        kc_acc_t s = 0;
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += xp[(t * IH + h) * IW + w];
        const int64_t cnt = divisor ? divisor : include_pad ? tn * hn * wn : (t1 - t0) * (h1 - h0) * (w1 - w0);
        out[r * OW + ow] = (float)(s / (kc_acc_t)cnt);
)K";

class PoolTemplate : public Template {
 public:
  const char* name() const override { return "cpu.pool"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    PoolGeom g;
    if (!handles(c, g)) return {};
    std::vector<KnobDim> s = {{"rows", rows_values(rows_of(g), g.out[2])}};
    if (!g.max) s.push_back({"acc", kOnOff});   // double or float window sums
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    PoolGeom g;
    handles(c, g);
    const bool mx = g.max;
    const std::string opname = op_info(c.op).name, entry = "kc_cpu_" + opname;
    Args a;
    a.ptr("float*", "out", "out0");
    if (g.indices) a.ptr("int64_t*", "idx", "out1");
    a.ptr("const float*", "in", "self");
    a.i64("rows", "numel(out0) / size(out0,-1)");
    const bool d3 = g.nd == 3;
    a.i64("IT", d3 ? "size(self,-3)" : "1");
    a.i64("IH", "size(self,-2)");
    a.i64("IW", "size(self,-1)");
    a.i64("OT", d3 ? "size(out0,-3)" : "1");
    a.i64("OH", "size(out0,-2)");
    a.i64("OW", "size(out0,-1)");
    // The window lists per axis, as literal arguments (the spec cannot index a list scalar).
    const char* axes = "THW";
    for (int i = 0; i < 3; ++i) {
      const std::string ax(1, axes[i]);
      a.i64("k" + ax, str(g.k[i]));
      // adaptive: the output size in the stride's slot (kAdaptiveWindowFn)
      a.i64("s" + ax, g.adaptive ? (i == 0 ? (d3 ? "size(out0,-3)" : "1") : "size(out0," + str(i - 3) + ")") : str(g.s[i]));
      a.i64("p" + ax, str(g.p[i]));
      a.i64("d" + ax, str(g.d[i]));
    }
    a.i64("divisor", str(g.divisor));
    a.i64("include_pad", g.count_include_pad ? "1" : "0");
    // max_pool*_values: the same taps, no index output.
    const std::string max_out =
        replace_all(kMaxOut, "@IDX_STORE@", g.indices ? "        idx[r * OW + ow] = bi;\n" : "        (void)bi;\n");
    std::string body = replace_all(kPoolBody, "@OUTPUT@", mx ? max_out : kAvgOut);
    std::string src = head(name(), opname, k.value()) + "#define KC_MAX " + (mx ? "1" : "0") + "\n" +
                      (mx ? "" : accumulators(k->at("acc") != 0)) + (g.adaptive ? kAdaptiveWindowFn : kWindowFn) +
                      kernel(entry, a, body);
    const int64_t per = k->at("rows");
    json l = json::array({launch(entry, "ceil_div(numel(out0) / size(out0,-1), " + str(per) + ")", per, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  static int64_t rows_of(const PoolGeom& g) { return g.planes * g.out[0] * g.out[1]; }

  static bool handles(const OpCall& c, PoolGeom& g) {
    if (c.backend != BackendKind::kCpu || op_info(c.op).family != OpFamily::kPool || !c.dense()) return false;
    const TensorMeta* x = defined_input(c, "self");
    if (!x || x->dtype != DType::kF32 || x->numel() <= 0) return false;
    auto r = pool_geometry(c);
    if (!r.is_ok()) return false;
    g = r.value();
    if (c.outputs.size() != (g.indices ? 2u : 1u) || !c.outputs[0].defined || c.outputs[0].dtype != DType::kF32) return false;
    return !g.indices || (c.outputs[1].defined && c.outputs[1].dtype == DType::kI64);
  }
};

}  // namespace

const Template* cpu_pool_template() {
  static const PoolTemplate t;
  return &t;
}

}  // namespace kc::evolve
