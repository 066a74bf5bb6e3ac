// The loss families in the CUDA template tests: their inputs (bce probabilities with exact 0 and 1,
// bce with logits' saturating logits and positive pos_weight, class targets with ignored entries, non-negative class weights,
// smooth_l1's and huber's backward branch edges) and fp64 references with
// per-element scales (template_gpu_reference.h).
#include <cmath>

#include "evolve/ops/loss.h"
#include "tests/gpu/template_gpu_reference.h"

namespace kc::evolve::gpu_ref {

Vec loss_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  const LossGeom g = loss_geometry(c).value();
  std::normal_distribution<double> nd(0, 1);
  std::uniform_real_distribution<double> ud(0, 1);
  Vec v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.name == "target" && g.kind == LossKind::kNll)
      v[i] = i % 5 == 3 ? static_cast<double>(g.ignore_index) : static_cast<double>(rng() % g.classes);
    else if (t.name == "weight") v[i] = std::fabs(nd(rng)) + 0.01;
    else if (t.name == "pos_weight") v[i] = std::fabs(nd(rng)) + 0.1;
    else if (g.kind == LossKind::kBceLogits) v[i] = t.name == "self" ? 3 * nd(rng) : i % 3 ? (rng() % 2) : ud(rng);
    else if (t.name == "grad_output") v[i] = nd(rng);
    else if (g.kind == LossKind::kBce) v[i] = t.name == "self" ? 1 / (1 + std::exp(-3 * nd(rng))) : i % 3 ? (rng() % 2) : ud(rng);
    else v[i] = 2 * nd(rng);
  }
  if (g.kind == LossKind::kBce && t.name == "self" && v.size() >= 4) v[1] = 0, v[2] = 1;   // log(0): the -100 clamp
  // Saturating logits: exp(-|x|) near and below fp32's smallest normal, where a term's two parts
  // cancel for t = 0 (x << 0); a half's range keeps them finite.
  const double edge[] = {30, -30, 90, -90, 200, -200, 0};
  if (g.kind == LossKind::kBceLogits && t.name == "self")
    for (size_t i = 5; i < v.size(); i += 53) v[i] = edge[(i / 53) % 7];
  // smooth_l1's and huber's backward: d = 0 and -0, d = +-p exactly (0.25 +- p: exact in every
  // dtype for the cases' p), NaN, where CUDA eager's branches decide.
  if (op_info(c.op).family == OpFamily::kLossBackward && (g.kind == LossKind::kSmoothL1 || g.kind == LossKind::kHuber) &&
      v.size() >= 8 && t.name != "grad_output") {
    const bool self = t.name == "self";
    v[1] = 0.75;
    v[2] = self ? -0.0 : 0.0;
    v[3] = self ? 0.25 + g.param : 0.25;
    v[4] = self ? 0.25 - g.param : 0.25;
    if (self) v[5] = NAN;
  }
  return v;
}

// Term i of bce with logits (parameters read at i % numel, a suffix broadcast): the value and the
// gauntlet's h (evolve/ops/loss_reference.cpp logits_terms says why).
void logits_term(const LossGeom& g, const std::map<std::string, Vec>& in, int64_t i, double& v, double& h) {
  const double x = in.at("self")[i], t = in.at("target")[i];
  const Vec* w = g.weighted ? &in.at("weight") : nullptr;
  const Vec* p = g.pos_weighted ? &in.at("pos_weight") : nullptr;
  const double wi = w ? (*w)[i % w->size()] : 1.0, pm1 = p ? (*p)[i % p->size()] - 1 : 0.0, lw = 1 + pm1 * t;
  const double sp = std::max(-x, 0.0) + std::log1p(std::exp(-std::fabs(x)));
  v = ((1 - t) * x + lw * sp) * wi;
  h = (2 * std::fabs(1 - t) * std::fabs(x) + sp * (2 * std::fabs(pm1 * t) + 5 * std::fabs(lw))) * std::fabs(wi) +
      2 * std::fabs(v);
}

// Per term: the value, h = |f'(d) d| + |term| (bce: the logs' magnitudes; nll: |term|) and the
// weight (nll). Reduction none: term by term; mean and sum: scale sum h (/ n) + |y|; nll's mean
// (sum h + |y| sum |w|) / |W| + |y|; total_weight sum |w| (0 exactly without reduction).
std::vector<Expect> loss(const OpCall& c, const std::map<std::string, Vec>& in) {
  const LossGeom g = loss_geometry(c).value();
  const Vec& x = in.at("self");
  const Vec& t = in.at("target");
  const Vec* w = g.weighted ? &in.at("weight") : nullptr;
  Expect e;
  double S = 0, H = 0, W = 0, Wabs = 0;
  for (int64_t i = 0; i < g.terms; ++i) {
    double v = 0, h = 0, wt = 0;
    if (g.kind == LossKind::kNll) {
      const int64_t cl = static_cast<int64_t>(t[i]);
      if (cl != g.ignore_index) {
        const int64_t row = i / g.spatial, s = i % g.spatial;
        wt = w ? (*w)[cl] : 1.0;
        v = -x[(row * g.classes + cl) * g.spatial + s] * wt;
        h = std::fabs(v);
      }
    } else if (g.kind == LossKind::kBceLogits) {
      logits_term(g, in, i, v, h);
    } else if (g.kind == LossKind::kBce) {
      const double lx = std::max(std::log(x[i]), -100.0), l1 = std::max(std::log1p(-x[i]), -100.0), ww = w ? (*w)[i] : 1;
      v = ((t[i] - 1) * l1 - t[i] * lx) * ww;
      h = (std::fabs(t[i] - 1) * std::fabs(l1) + std::fabs(t[i]) * std::fabs(lx)) * std::fabs(ww) + std::fabs(v);
    } else {
      const double a = std::fabs(x[i] - t[i]), p = g.param;
      const bool quad = g.kind == LossKind::kMse || a < p;
      const double k = g.kind == LossKind::kHuber ? 1 : g.kind == LossKind::kMse ? 2 : 1 / p;
      v = quad ? 0.5 * k * a * a : g.kind == LossKind::kHuber ? p * (a - 0.5 * p) : a - 0.5 * p;
      h = (quad ? k * a * a : g.kind == LossKind::kHuber ? p * a : a) + v;
    }
    if (g.elementwise()) e.ref.push_back(v), e.scale.push_back(h);
    S += v, H += h, W += wt, Wabs += std::fabs(wt);
  }
  const bool mean = g.reduction == LossReduction::kMean;
  Expect total{{g.elementwise() ? 0.0 : W}, {g.elementwise() ? 0.0 : Wabs}};
  if (!g.elementwise()) {
    const double n = static_cast<double>(g.terms);
    if (g.kind != LossKind::kNll) e = {{mean ? S / n : S}, {(mean ? H / n : H) + std::fabs(mean ? S / n : S)}};
    else if (!mean) e = {{S}, {H + std::fabs(S)}};
    else e = {{S / W}, {(H + std::fabs(S / W) * Wabs) / std::fabs(W) + std::fabs(S / W)}};
  }
  if (g.kind == LossKind::kNll) return {e, total};
  return {e};
}

double nll_total_weight(const OpCall& c, const std::map<std::string, Vec>& in) {
  const LossGeom g = loss_geometry(c).value();
  if (g.elementwise()) return 0;
  double W = 0;
  for (int64_t i = 0; i < g.terms; ++i) {
    const int64_t cl = static_cast<int64_t>(in.at("target")[i]);
    if (cl != g.ignore_index) W += g.weighted ? in.at("weight")[cl] : 1.0;
  }
  return W;
}

// grad_input, with a scale of its own magnitude (a few roundings of one product): mse
// norm (x - t) g, bce g (x - t) / max((1 - x) x, 1e-12) w (/ n), nll -w[c] g (mean: g / W) at
// each non-ignored pick and 0 elsewhere; smooth_l1 and huber in CUDA eager's branches
// (templates_cuda_loss_backward.cpp: beta 0 gives NaN at d = 0, NaN stays NaN).
std::vector<Expect> loss_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const LossGeom g = loss_geometry(c).value();
  const Vec& x = in.at("self");
  const Vec& t = in.at("target");
  const Vec& go = in.at("grad_output");
  const Vec* w = g.weighted ? &in.at("weight") : nullptr;
  const bool mean = g.reduction == LossReduction::kMean;
  const double n = static_cast<double>(g.terms);
  Expect e{Vec(x.size(), 0.0), Vec(x.size(), 0.0)};
  if (g.kind == LossKind::kNll) {
    const double W = in.at("total_weight")[0];
    for (int64_t i = 0; i < g.terms; ++i) {
      const int64_t cl = static_cast<int64_t>(t[i]);
      if (cl == g.ignore_index) continue;
      const size_t at = ((i / g.spatial) * g.classes + cl) * g.spatial + i % g.spatial;
      const double gv = go[g.elementwise() ? i : 0];
      e.ref[at] = -(mean ? gv / W : gv) * (w ? (*w)[cl] : 1.0);
      e.scale[at] = std::fabs(e.ref[at]);
    }
    return {e};
  }
  const bool huber = g.kind == LossKind::kHuber;
  for (size_t i = 0; i < x.size(); ++i) {
    const double gv = go[g.elementwise() ? i : 0];
    if (huber || g.kind == LossKind::kSmoothL1) {
      const double d = x[i] - t[i], p = g.param, nm = mean ? 1 / n : 1.0, lin = huber ? p : 1.0;
      e.ref[i] = d < -p ? -nm * gv * lin : d > p ? nm * gv * lin : nm * d * gv / (huber ? 1.0 : p);
      e.scale[i] = std::fabs(e.ref[i]);
      continue;
    }
    e.ref[i] = g.kind == LossKind::kMse ? (mean ? 2 / n : 2.0) * (x[i] - t[i]) * gv
                                        : gv * (x[i] - t[i]) / std::max((1 - x[i]) * x[i], 1e-12) * (w ? (*w)[i] : 1.0) /
                                              (mean ? n : 1.0);
    e.scale[i] = std::fabs(e.ref[i]);
  }
  return {e};
}

}  // namespace kc::evolve::gpu_ref
