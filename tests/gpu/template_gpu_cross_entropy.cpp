// Cross-entropy in the CUDA template GPU tests: the inputs (logits around per-row offsets with a
// -inf logit where the loss stays finite, class targets with ignored rows, softmax
// probabilities, positive weights), the fp64 references of the forward (loss, lse) and the
// backward (grad_self from the exact lse), with per-element scales following the formulas'
// conditioning, and the cases: every flag and reduction, 1-d self, halves with upcast's fp32
// weight and probabilities, LLM vocabularies (a block a row); and timings of the LLM shape.
// Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "evolve/ops/cross_entropy.h"
#include "evolve/propose/proposer.h"
#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {
namespace {

CrossEntropyGeom geom(const OpCall& c) { return cross_entropy_geometry(c).value(); }

bool minus_inf(const CrossEntropyGeom& g) {
  return g.classes > 1 && g.rows > 2 && (g.backward || (!g.probs && g.label_smoothing == 0));
}

// One row's statistics in fp64: lse, the term, its scale h and its weight in the mean's D.
// H_lse = |lse| + |m| + |log S| + 1 + sum_j y_j |x_j - m| (y: the softmax); class terms
// (1 - e) |w_t| (H_lse + |x_t| + |lse - x_t|) plus, smoothed, (e / C) (|W| H_lse + sum |w x| +
// |x_0| |W| + |lse W| + |sum w x|) (the kernel's sums are shifted by x_0); probabilities
// |Q| H_lse + sum |w q x| + |x_0| |Q| + |lse Q| + |sum w q x|; plus |term|.
struct Row {
  double lse = 0, H = 0, term = 0, h = 0, wt = 0;
};

Row row_of(const CrossEntropyGeom& g, const std::map<std::string, Vec>& in, int64_t r) {
  const int64_t C = g.classes;
  const double* x = in.at("self").data() + r * C;
  const Vec* w = g.weighted ? &in.at("weight") : nullptr;
  const double e = g.label_smoothing;
  double m = -INFINITY, S = 0, Y = 0;
  for (int64_t j = 0; j < C; ++j) m = std::max(m, x[j]);
  for (int64_t j = 0; j < C; ++j)
    if (x[j] != -INFINITY) S += std::exp(x[j] - m), Y += std::exp(x[j] - m) * std::fabs(x[j] - m);
  Row o;
  o.lse = m + std::log(S);
  const double H = o.H = std::fabs(o.lse) + std::fabs(m) + std::fabs(std::log(S)) + 1 + Y / S;
  const double x0 = std::isfinite(x[0]) ? std::fabs(x[0]) : 0.0;
  double W = 0, WX = 0, AWX = 0;   // probabilities: Q, sum w q x, sum |w q x|
  for (int64_t j = 0; j < C; ++j) {
    double ww = w ? (*w)[j] : 1.0;
    if (g.probs) ww *= (1 - e) * in.at("target")[r * C + j] + e / C;
    W += ww, WX += ww * x[j], AWX += std::fabs(ww * x[j]);
  }
  const double hs = std::fabs(W) * H + AWX + x0 * std::fabs(W) + std::fabs(o.lse * W) + std::fabs(WX);
  if (g.probs) {
    o.term = o.lse * W - WX, o.h = hs, o.wt = 1;
  } else {
    const int64_t t = static_cast<int64_t>(in.at("target")[r]);
    if (t == g.ignore_index) return o;
    o.wt = w ? (*w)[t] : 1.0;
    o.term = (1 - e) * o.wt * (o.lse - x[t]);
    o.h = (1 - e) * std::fabs(o.wt) * (H + std::fabs(x[t]) + std::fabs(o.lse - x[t]));
    if (e > 0) o.term += (e / C) * (o.lse * W - WX), o.h += (e / C) * hs;   // a -inf logit: 0 * inf otherwise
  }
  o.h += std::fabs(o.term);
  return o;
}

}  // namespace

Vec ce_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  const CrossEntropyGeom g = geom(c);
  std::normal_distribution<double> nd(0, 1);
  const int64_t C = g.classes;
  Vec v(t.numel());
  if (t.name == "self") {
    for (size_t i = 0; i < v.size(); ++i) v[i] = (i / C % 4 == 1 ? 40.0 : 0.0) + 3 * nd(rng);
    if (minus_inf(g)) v[2 * C + C - 1] = -INFINITY;
  } else if (t.name == "target" && g.probs) {   // a softmax of each row
    for (int64_t r = 0; r < g.rows; ++r) {
      double s = 0;
      for (int64_t j = 0; j < C; ++j) s += (v[r * C + j] = std::exp(nd(rng)));
      for (int64_t j = 0; j < C; ++j) v[r * C + j] /= s;
    }
  } else if (t.name == "target") {   // ignored rows now and then; row 2 not at its -inf logit
    for (int64_t r = 0; r < g.rows; ++r) {
      int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(C));
      if (r == 2 && k == C - 1 && minus_inf(g)) k = 0;
      v[r] = static_cast<double>(r % 5 == 3 ? g.ignore_index : k);
    }
  } else if (t.name == "weight") {
    for (auto& x : v) x = std::fabs(nd(rng)) + 0.1;
  } else {   // grad
    for (auto& x : v) x = nd(rng);
  }
  for (auto& x : v) x = Host::round(t.dtype, x);
  return v;
}

Vec ce_lse(const OpCall& c, const std::map<std::string, Vec>& in) {
  const CrossEntropyGeom g = geom(c);
  Vec v(g.rows);
  for (int64_t r = 0; r < g.rows; ++r) v[r] = Host::round(DType::kF32, row_of(g, in, r).lse);
  return v;
}

// loss: per row (reduction none, or a 1-d self's only row) or folded: sum (scale sum h + |y|), or
// the mean over D = sum of the rows' weights (scale sum h / |D| + |y|); lse with scale H_lse.
std::vector<Expect> cross_entropy(const OpCall& c, const std::map<std::string, Vec>& in) {
  const CrossEntropyGeom g = geom(c);
  Expect loss, lse;
  double V = 0, Hs = 0, D = 0;
  for (int64_t r = 0; r < g.rows; ++r) {
    const Row o = row_of(g, in, r);
    lse.ref.push_back(o.lse);
    lse.scale.push_back(o.H);
    if (g.per_row() || (g.one_d && g.reduction == LossReduction::kNone)) loss.ref.push_back(o.term), loss.scale.push_back(o.h);
    V += o.term, Hs += o.h, D += o.wt;
  }
  if (loss.ref.empty()) {
    const bool mean = g.reduction == LossReduction::kMean;
    const double y = mean ? V / D : V;
    loss.ref = {y};
    loss.scale = {(mean ? Hs / std::fabs(D) : Hs) + std::fabs(y)};
  }
  return {loss, lse};
}

// grad_self[i, j] = s_i (class: (1 - e) w_t (P_j - [j == t]) + (e / C) (W P_j - w_j);
// probabilities: P_j Q - w_j q_j), 0 on ignored rows; scale |s| times the terms' magnitudes
// times 1 + |x_j| + |lse| (the exp's argument and the fp32 lse the kernel is given).
std::vector<Expect> cross_entropy_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const CrossEntropyGeom g = geom(c);
  const int64_t C = g.classes;
  const Vec& x = in.at("self");
  const Vec* w = g.weighted ? &in.at("weight") : nullptr;
  const double e = g.label_smoothing;
  auto wj = [&](int64_t j) { return w ? (*w)[j] : 1.0; };
  double D = 0, W = 0;
  for (int64_t j = 0; j < C; ++j) W += wj(j);
  for (int64_t r = 0; r < g.rows; ++r) {
    if (g.probs) D += 1;
    else if (static_cast<int64_t>(in.at("target")[r]) != g.ignore_index) D += wj(static_cast<int64_t>(in.at("target")[r]));
  }
  Expect out{Vec(x.size(), 0.0), Vec(x.size(), 0.0)};
  for (int64_t r = 0; r < g.rows; ++r) {
    double s = in.at("grad")[g.per_row() ? r : 0];
    if (g.reduction == LossReduction::kMean) s /= D;
    const double l = row_of(g, in, r).lse;
    const int64_t t = g.probs ? -1 : static_cast<int64_t>(in.at("target")[r]);
    if (!g.probs && t == g.ignore_index) continue;
    double Q = 0;
    for (int64_t j = 0; j < C && g.probs; ++j) Q += wj(j) * ((1 - e) * in.at("target")[r * C + j] + e / C);
    for (int64_t j = 0; j < C; ++j) {
      const size_t i = r * C + j;
      const double P = std::exp(x[i] - l), k = 1 + (std::isfinite(x[i]) ? std::fabs(x[i]) : 0.0) + std::fabs(l);
      if (g.probs) {
        const double q = wj(j) * ((1 - e) * in.at("target")[i] + e / C);
        out.ref[i] = s * (P * Q - q);
        out.scale[i] = std::fabs(s) * (P * std::fabs(Q) + q) * k;
      } else {
        const double wt = wj(t), d = j == t ? 1.0 : 0.0;
        out.ref[i] = s * ((1 - e) * wt * (P - d) + (e / C) * (W * P - wj(j)));
        out.scale[i] = std::fabs(s) * ((1 - e) * wt * (P + d) + (e / C) * (W * P + wj(j))) * k;
      }
    }
  }
  return {out};
}

}  // namespace kc::evolve::gpu_ref

namespace kc::evolve {
namespace {

using nlohmann::json;
using gpu_run::Case;
using gpu_run::Emulated;
using gpu_run::Gpu;
using gpu_run::Rounding;
using gpu_run::run_all;

// The cases of op: every reduction of a weighted, smoothed, partly ignored call (warp rows), a
// row of 11 (vectors of one), probabilities, 1-d self, halves, upcast, LLM vocabularies with the
// block-per-row settings, and every row ignored (the mean is NaN).
std::vector<Case> ce_cases(OpId op) {
  std::vector<Case> cs;
  for (int64_t r : {0, 1, 2}) {
    const json wsm = {{"reduction", r}, {"weight", true}, {"label_smoothing", 0.1}, {"ignore_index", 3}};
    cs.push_back({op, {37, 1000}, DType::kF32, wsm, 3, {{{"threads", 256}, {"unroll", 4}}}});
    cs.push_back({op, {37, 11}, DType::kF32, {{"reduction", r}, {"ignore_index", 3}}, 2});
    cs.push_back({op, {9, 130}, DType::kF32, {{"reduction", r}, {"probs", true}, {"weight", true}, {"label_smoothing", 0.2}}, 2});
    cs.push_back({op, {7}, DType::kF32, {{"reduction", r}, {"weight", true}}, 1});
    cs.push_back({op, {5, 4096}, DType::kBF16, {{"reduction", r}, {"label_smoothing", 0.1}}, 2,
                  {{{"threads", 1024}, {"unroll", 4}}}});
    cs.push_back({op, {130, 33}, DType::kF16, {{"reduction", r}, {"probs", true}}, 2});
  }
  cs.push_back({op, {64, 1000}, DType::kBF16, {{"probs", true}, {"weight", true}, {"upcast", true}}, 2});
  cs.push_back({op, {64, 1000}, DType::kBF16, {{"reduction", 0}, {"weight", true}, {"label_smoothing", 0.1}, {"upcast", true}}, 2});
  cs.push_back({op, {7}, DType::kF16, {{"probs", true}, {"reduction", 2}}, 1});
  cs.push_back({op, {2048, 32000}, DType::kBF16, {{"ignore_index", 7}}, 1});
  cs.push_back({op, {512, 128256}, DType::kBF16, json::object(), 1, {{{"threads", 512}}, {{"threads", 1024}, {"unroll", 4}}}});
  cs.push_back({op, {5, 1}, DType::kF32, {{"ignore_index", 0}}, 1});   // every target ignored
  return cs;
}

TEST_F(Gpu, CrossEntropy) { run_all(*this, ce_cases(OpId::kCrossEntropy), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, CrossEntropy) { EXPECT_GE(run_all(*this, ce_cases(OpId::kCrossEntropy), 2e-5, Rounding::kOnce), 10); }

TEST_F(Gpu, CrossEntropyBackward) { run_all(*this, ce_cases(OpId::kCrossEntropyBackward), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, CrossEntropyBackward) { EXPECT_GE(run_all(*this, ce_cases(OpId::kCrossEntropyBackward), 2e-5, Rounding::kOnce), 10); }

// The LLM shape (8192 rows of a 128256-token vocabulary, bf16): a few settings of each direction
// timed on zeroed inputs, with the bandwidth of self read once (forward) or read and written
// (backward). Prints only: the numbers inform the templates' defaults, they are no pass/fail bar.
TEST_F(Gpu, CrossEntropyTimings) {
  const std::vector<int64_t> llm = {8192, 128256};
  const double bytes = 8192.0 * 128256 * 2;
  const std::vector<Knobs> knobs = {{}, {{"unroll", 4}}, {{"threads", 512}}, {{"threads", 512}, {"unroll", 4}},
                                    {{"threads", 256}, {"unroll", 4}}, {{"threads", 1024}, {"unroll", 1}}};
  for (OpId op : {OpId::kCrossEntropy, OpId::kCrossEntropyBackward})
    for (const json& a : {json{{"reduction", 1}}, json{{"reduction", 1}, {"label_smoothing", 0.1}}}) {
      auto cr = make_call(op, llm, DType::kBF16, BackendKind::kCuda, a);
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), knobs, 300, timed);
      ASSERT_FALSE(HasFatalFailure());
      const double moved = op == OpId::kCrossEntropy ? bytes : 2 * bytes;
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-24s %-22s %-62s %8.4f ms %6.0f GB/s\n", op_info(op).name, a.dump().c_str(), tm.id.c_str(),
                    tm.median_ms, moved / (tm.median_ms * 1e6));
    }
}

}  // namespace
}  // namespace kc::evolve
