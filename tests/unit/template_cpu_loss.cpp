// The loss families in the CPU template tests: their inputs (bce probabilities with exact 0 and 1,
// bce with logits' saturating logits and positive pos_weight, int64 class targets with ignored entries, non-negative class weights; a backward's forward
// inputs, smooth_l1's and huber's branch edges and nll's total weight) and double-precision references with per-element scales
// (template_cpu_reference.h).
#include <cmath>
#include <cstring>
#include <random>

#include "evolve/ops/loss.h"
#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve::cpu_ref {
namespace {

// An int64 tensor's elements in the float buffer that holds its bytes (two floats an element).
void put_i64(std::vector<float>& buf, size_t i, int64_t v) { std::memcpy(&buf[2 * i], &v, 8); }
int64_t get_i64(const std::vector<float>& buf, size_t i) {
  int64_t v;
  std::memcpy(&v, &buf[2 * i], 8);
  return v;
}

struct Term {
  double v = 0, h = 0, w = 0;   // the term, its condition magnitude, its weight (nll)
};

// Term i of bce with logits, its parameters read at i % numel (a suffix broadcast): the value and
// the gauntlet's h (evolve/ops/loss_reference.cpp logits_terms says why).
Term logits_term(const LossGeom& g, Buffers& b, size_t i) {
  const double x = b["self"][i], t = b["target"][i];
  const double w = g.weighted ? b["weight"][i % b["weight"].size()] : 1.0;
  const double pm1 = g.pos_weighted ? b["pos_weight"][i % b["pos_weight"].size()] - 1.0 : 0.0, lw = 1 + pm1 * t;
  const double sp = std::max(-x, 0.0) + std::log1p(std::exp(-std::fabs(x)));
  Term r;
  r.v = ((1 - t) * x + lw * sp) * w;
  r.h = (2 * std::fabs(1 - t) * std::fabs(x) + sp * (2 * std::fabs(pm1 * t) + 5 * std::fabs(lw))) * std::fabs(w) +
        2 * std::fabs(r.v);
  return r;
}

// Term i of an elementwise loss: h = |f'(d) d| + |term| (bce: the logs' magnitudes), as the
// gauntlet's model (evolve/ops/loss_reference.cpp).
Term elementwise_term(const LossGeom& g, Buffers& b, size_t i) {
  if (g.kind == LossKind::kBceLogits) return logits_term(g, b, i);
  const double x = b["self"][i], t = b["target"][i], w = g.weighted ? b["weight"][i] : 1.0, p = g.param;
  Term r;
  if (g.kind == LossKind::kBce) {
    const double lx = std::max(std::log(x), -100.0), l1 = std::max(std::log1p(-x), -100.0);
    r.v = ((t - 1) * l1 - t * lx) * w;
    r.h = (std::fabs(t - 1) * std::fabs(l1) + std::fabs(t) * std::fabs(lx)) * std::fabs(w) + std::fabs(r.v);
    return r;
  }
  const double a = std::fabs(x - t);
  if (g.kind == LossKind::kMse) r.v = a * a, r.h = 3 * a * a;
  else if (g.kind == LossKind::kSmoothL1) r.v = a < p ? 0.5 * a * a / p : a - 0.5 * p, r.h = (a < p ? a * a / p : a) + r.v;
  else r.v = a < p ? 0.5 * a * a : p * (a - 0.5 * p), r.h = (a < p ? a * a : p * a) + r.v;
  return r;
}

// Target i of nll: -w[c] x[(row, c, s)]; 0 (and no weight) where ignored.
Term nll_term(const LossGeom& g, Buffers& b, size_t i) {
  const int64_t c = get_i64(b["target"], i);
  Term r;
  if (c == g.ignore_index) return r;
  const int64_t row = static_cast<int64_t>(i) / g.spatial, s = static_cast<int64_t>(i) % g.spatial;
  r.w = g.weighted ? b["weight"][c] : 1.0;
  r.v = -static_cast<double>(b["self"][(row * g.classes + c) * g.spatial + s]) * r.w;
  r.h = std::fabs(r.v);
  return r;
}

// bce with logits: logits of scale 3 with saturating ones (exp(-|x|) at the edge of fp32's range
// and below, where the two parts of a term cancel for t = 0), target as bce's, pos_weight > 0.
void logits_inputs(Buffers& b, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  auto& x = b["self"];
  auto& t = b["target"];
  const float edge[] = {30.f, -30.f, 90.f, -90.f, 200.f, -200.f, 0.f};
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = i % 53 == 5 ? edge[(i / 53) % 7] : 3.f * x[i];
    t[i] = i % 3 == 0 ? static_cast<float>(ud(rng)) : static_cast<float>(rng() % 2);
  }
  if (b.count("pos_weight"))
    for (auto& v : b["pos_weight"]) v = std::fabs(v) + 0.1f;
}

// The forward's inputs: bce in (0, 1) with exact 0 and 1, nll classes with ignored entries and
// non-negative weights, the regression losses' self scaled by 2.
void forward_inputs(const LossGeom& g, Buffers& b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  if (g.kind == LossKind::kBceLogits) return logits_inputs(b, rng);
  if (g.kind == LossKind::kBce) {
    auto& x = b["self"];
    auto& t = b["target"];
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<float>(1.0 / (1.0 + std::exp(-3.0 * x[i])));
      t[i] = i % 3 == 0 ? static_cast<float>(ud(rng)) : static_cast<float>(rng() % 2);
    }
    if (x.size() >= 4) x[1] = 0.f, x[2] = 1.f;   // the -100 clamp of log(0)
    return;
  }
  for (auto& v : b["self"]) v *= 2.f;
  if (g.kind != LossKind::kNll) return;
  auto& t = b["target"];
  t.assign(2 * g.terms, 0.f);
  for (int64_t i = 0; i < g.terms; ++i)
    put_i64(t, i, i % 5 == 3 ? g.ignore_index : static_cast<int64_t>(rng() % static_cast<uint64_t>(g.classes)));
  if (g.weighted)
    for (auto& v : b["weight"]) v = std::fabs(v) + 0.01f;
}

// smooth_l1's and huber's backward: CPU eager's branches at their edges (d = 0 and -0, d = +-p
// exactly, NaN); exact in float for p = 0.5, 2 and 0 (0.25 +- p).
void edge_inputs(const LossGeom& g, Buffers& b) {
  auto& x = b["self"];
  auto& t = b["target"];
  if ((g.kind != LossKind::kSmoothL1 && g.kind != LossKind::kHuber) || x.size() < 8) return;
  const float p = static_cast<float>(g.param);
  x[1] = t[1];
  x[2] = -0.f, t[2] = 0.f;
  t[3] = t[4] = 0.25f;
  x[3] = 0.25f + p, x[4] = 0.25f - p;
  x[5] = NAN;
}

// The gradient of self's element i (elementwise losses) with a scale of a few roundings of it;
// smooth_l1 and huber as CPU eager branches (templates_cpu_loss_backward.cpp says how).
double elementwise_grad(const OpCall& c, const LossGeom& g, Buffers& b, size_t i) {
  const double x = b["self"][i], t = b["target"][i], w = g.weighted ? b["weight"][i] : 1.0;
  const double go = b["grad_output"][g.elementwise() ? i : 0], n = static_cast<double>(g.terms);
  const bool mean = g.reduction == LossReduction::kMean;
  if (c.op == OpId::kMseLossBackward) return (mean ? 2.0 / n : 2.0) * (x - t) * go;
  if (g.kind == LossKind::kSmoothL1 || g.kind == LossKind::kHuber) {
    const double d = x - t, p = g.param, s = d > 0 ? 1.0 : -1.0;
    const bool lin = std::fabs(d) >= p;   // false for NaN
    const double o = g.kind == LossKind::kSmoothL1 ? (lin ? s : d / p) : (lin ? s * p : d);
    return (mean ? 1.0 / n : 1.0) * o * go;
  }
  return go * (x - t) / std::max((1 - x) * x, 1e-12) * w / (mean ? n : 1.0);
}

// grad_input of nll: -w[c] g (mean: g / W) at each non-ignored target's pick, 0 elsewhere.
void nll_grad(const LossGeom& g, Buffers& b, Expect& e) {
  const bool mean = g.reduction == LossReduction::kMean;
  const double W = b["total_weight"][0];
  for (int64_t i = 0; i < g.terms; ++i) {
    const int64_t cl = get_i64(b["target"], i);
    if (cl == g.ignore_index) continue;
    const int64_t row = i / g.spatial, s = i % g.spatial;
    const double go = b["grad_output"][g.elementwise() ? i : 0], w = g.weighted ? b["weight"][cl] : 1.0;
    const size_t at = (row * g.classes + cl) * g.spatial + s;
    e.ref[at] = -(mean ? go / W : go) * w;
    e.scale[at] = std::fabs(e.ref[at]);
  }
}

}  // namespace

void loss_inputs(const OpCall& c, Buffers& b, uint64_t seed) {
  const LossGeom g = loss_geometry(c).value();
  forward_inputs(g, b, seed);
  if (b.count("grad_output")) edge_inputs(g, b);
  if (!b.count("total_weight")) return;
  // nll backward: the forward's total weight (0 without reduction on a batched self).
  double W = 0;
  for (int64_t i = 0; i < g.terms && !g.elementwise(); ++i) W += nll_term(g, b, i).w;
  b["total_weight"][0] = static_cast<float>(W);
}

void loss_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  const LossGeom g = loss_geometry(c).value();
  Expect& e = out[0];
  e.k = 16;
  if (g.kind == LossKind::kNll) return nll_grad(g, b, e);
  for (size_t i = 0; i < e.ref.size(); ++i) {
    e.ref[i] = elementwise_grad(c, g, b, i);
    e.scale[i] = std::fabs(e.ref[i]);
  }
}

// Elementwise: each term within k ulp of h. Reduced: the terms summed in double (the kernel sums
// float terms, each within its h), so scale sum h (mean: / n); nll's mean S / W adds |y| sum |w|
// to the numerator's scale, over |W|.
void loss(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  const LossGeom g = loss_geometry(c).value();
  for (auto& e : out) e.k = 16;
  double S = 0, H = 0, W = 0, Wabs = 0;
  for (int64_t i = 0; i < g.terms; ++i) {
    const Term t = g.kind == LossKind::kNll ? nll_term(g, b, i) : elementwise_term(g, b, i);
    if (g.elementwise()) {
      out[0].ref[i] = t.v;
      out[0].scale[i] = t.h;
    }
    S += t.v, H += t.h, W += t.w, Wabs += std::fabs(t.w);
  }
  if (g.kind == LossKind::kNll) {
    out[1].ref[0] = g.elementwise() ? 0.0 : W;
    out[1].scale[0] = g.elementwise() ? 0.0 : Wabs;
  }
  if (g.elementwise()) return;
  const bool mean = g.reduction == LossReduction::kMean;
  if (g.kind != LossKind::kNll) {
    const double n = static_cast<double>(g.terms);
    out[0].ref[0] = mean ? S / n : S;
    out[0].scale[0] = (mean ? H / n : H) + std::fabs(out[0].ref[0]);
    return;
  }
  const double y = mean ? S / W : S;
  out[0].ref[0] = y;
  out[0].scale[0] = mean ? (H + std::fabs(y) * Wabs) / std::fabs(W) + std::fabs(y) : H + std::fabs(y);
}

}  // namespace kc::evolve::cpu_ref
