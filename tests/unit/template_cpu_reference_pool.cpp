// Pooling backward references for the CPU template tests (template_cpu_reference.h), straight from
// the definition, the scatter the templates do not use: each output's gradient goes to its argmax
// (max) or over its window divided by the window's divisor (average, adaptive). An element within
// 16 ulp (32 u) of the sum of its terms' magnitudes: the terms are at most 27 here, and a sum of
// m terms errs by at most (m - 1) u of that in any order.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "evolve/ops/pool.h"
#include "tests/unit/pool_window.h"
#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve::cpu_ref {
namespace {

using pool_ref::Win;
using pool_ref::window;

int64_t load_i64(const std::vector<float>& v, int64_t i) {
  int64_t q;
  std::memcpy(&q, &v[2 * i], 8);
  return q;
}

}  // namespace

void pool_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  const PoolGeom g = pool_geometry(c).value();
  const auto& dy = b["grad_output"];
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  std::vector<double> mag(out[0].ref.size(), 0);
  auto add = [&](int64_t i, double v) {
    out[0].ref[i] += v;
    mag[i] += std::fabs(v);
  };
  for (int64_t pl = 0; pl < g.planes; ++pl)
    for (int64_t j = 0; j < out_plane; ++j) {
      const double d = dy[pl * out_plane + j];
      if (g.max) {
        add(pl * in_plane + load_i64(b["indices"], pl * out_plane + j), d);
        continue;
      }
      const int64_t o[3] = {j / (g.out[1] * g.out[2]), j / g.out[2] % g.out[1], j % g.out[2]};
      const Win wt = window(g, 0, o[0]), wh = window(g, 1, o[1]), ww = window(g, 2, o[2]);
      const int64_t clipped = (wt.hi - wt.lo) * (wh.hi - wh.lo) * (ww.hi - ww.lo);
      const double div = g.divisor ? g.divisor
                         : g.count_include_pad || g.adaptive ? wt.padded * wh.padded * ww.padded : clipped;
      for (int64_t t = wt.lo; t < wt.hi; ++t)
        for (int64_t h = wh.lo; h < wh.hi; ++h)
          for (int64_t w = ww.lo; w < ww.hi; ++w) add(pl * in_plane + (t * g.in[1] + h) * g.in[2] + w, d / div);
    }
  for (size_t i = 0; i < mag.size(); ++i) out[0].scale[i] = mag[i] + std::fabs(out[0].ref[i]);
}

void argmax_indices(const OpCall& c, Buffers& b) {
  OpCall f;
  f.op = pool_forward_of(c.op);
  f.backend = c.backend;
  f.inputs = {*c.input("self")};
  f.scalars = c.scalars;
  f.outputs = infer_outputs(f.op, f.inputs, f.scalars, c.backend).value();
  const std::vector<Expect> e = reference(f, b);
  std::vector<float>& idx = b["indices"];
  idx.assign(2 * e[1].ref.size(), 0.f);
  for (size_t i = 0; i < e[1].ref.size(); ++i) {
    const int64_t q = static_cast<int64_t>(e[1].ref[i]);
    std::memcpy(&idx[2 * i], &q, 8);
  }
}

}  // namespace kc::evolve::cpu_ref
