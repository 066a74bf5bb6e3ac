// Pooling backward references for the CUDA template tests (template_gpu_reference.h), straight
// from the definition, the scatter the template does not use: each output's gradient goes to its
// argmax (max) or over its window divided by the window's divisor (average, adaptive). Scale: the
// sum of the terms' magnitudes plus |grad_input| (a sum of m terms errs by at most (m - 1) u of
// that in any order).
#include <algorithm>
#include <cmath>

#include "evolve/ops/pool.h"
#include "tests/gpu/template_gpu_reference.h"
#include "tests/unit/pool_window.h"

namespace kc::evolve::gpu_ref {
namespace {

using pool_ref::Win;
using pool_ref::window;

}  // namespace

std::vector<Expect> pool_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const PoolGeom g = pool_geometry(c).value();
  const Vec& dy = in.at("grad_output");
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  Expect e{Vec(g.planes * in_plane, 0.0), Vec(g.planes * in_plane, 0.0)};
  auto add = [&](int64_t i, double v) {
    e.ref[i] += v;
    e.scale[i] += std::fabs(v);
  };
  for (int64_t pl = 0; pl < g.planes; ++pl)
    for (int64_t j = 0; j < out_plane; ++j) {
      const double d = dy[pl * out_plane + j];
      if (g.max) {
        add(pl * in_plane + static_cast<int64_t>(in.at("indices")[pl * out_plane + j]), d);
        continue;
      }
      const Win wt = window(g, 0, j / (g.out[1] * g.out[2])), wh = window(g, 1, j / g.out[2] % g.out[1]),
                ww = window(g, 2, j % g.out[2]);
      const double clipped = static_cast<double>((wt.hi - wt.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo));
      const double div = g.divisor ? static_cast<double>(g.divisor)
                         : g.count_include_pad || g.adaptive ? static_cast<double>(wt.padded * wh.padded * ww.padded)
                                                             : clipped;
      for (int64_t t = wt.lo; t < wt.hi; ++t)
        for (int64_t h = wh.lo; h < wh.hi; ++h)
          for (int64_t w = ww.lo; w < ww.hi; ++w) add(pl * in_plane + (t * g.in[1] + h) * g.in[2] + w, d / div);
    }
  for (size_t i = 0; i < e.ref.size(); ++i) e.scale[i] += std::fabs(e.ref[i]);
  return {e};
}

Vec argmax_indices(const OpCall& c, const std::map<std::string, Vec>& in) {
  OpCall f;
  f.op = pool_forward_of(c.op);
  f.backend = c.backend;
  f.inputs = {*c.input("self")};
  f.scalars = c.scalars;
  f.outputs = infer_outputs(f.op, f.inputs, f.scalars, c.backend).value();
  return reference(f, {{"self", in.at("self")}})[1].ref;
}

}  // namespace kc::evolve::gpu_ref
