// KL divergence in the CUDA template GPU tests: the inputs (self around zero, target
// probabilities with exact zeros or log-probabilities), the fp64 references of the forward
// (elementwise, or one sum / mean with the magnitudes summed as its scale) and the backward, the
// cases (every candidate of the knob space sampled over the shapes: KernelBench's (32768, 4096)
// batchmean in f32 and bf16, every reduction, log_target both ways, odd sizes with a tail), and
// the achieved bandwidth of the default and a few settings. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "evolve/ops/kl_div.h"
#include "evolve/propose/proposer.h"
#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {

Vec kl_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  const KlDivGeom g = kl_div_geometry(c).value();
  std::normal_distribution<double> nd(0, 1);
  std::uniform_real_distribution<double> ud(0, 1);
  Vec v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.name == "target") v[i] = g.log_target ? -std::fabs(2 * nd(rng)) : (i % 7 == 3 ? 0.0 : ud(rng));
    else v[i] = (t.name == "grad" ? 1.0 : 2.0) * nd(rng);
  }
  for (auto& x : v) x = Host::round(t.dtype, x);
  return v;
}

// Per term v and its magnitude h (evolve/ops/kl_div_reference.cpp): 2 |t log t| + |t x| + |v|,
// or 3 |v| with log_target; a sum's scale is sum h + sqrt(n) sum |v| (fp32 partial sums in any
// fixed order), over n for the mean.
std::vector<Expect> kl_div(const OpCall& c, const std::map<std::string, Vec>& in) {
  const KlDivGeom g = kl_div_geometry(c).value();
  const Vec &x = in.at("self"), &t = in.at("target");
  const size_t n = x.size();
  Expect e{Vec(g.elementwise() ? n : 1, 0.0), Vec(g.elementwise() ? n : 1, 0.0)};
  double sum = 0, h_sum = 0, abs_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    double v, h;
    if (g.log_target) {
      v = std::exp(t[i]) * (t[i] - x[i]);
      h = 3 * std::fabs(v);
    } else {
      const double tl = t[i] == 0 ? 0.0 : t[i] * std::log(t[i]);
      v = tl - t[i] * x[i];
      h = 2 * std::fabs(tl) + std::fabs(t[i] * x[i]) + std::fabs(v);
    }
    if (g.elementwise()) {
      e.ref[i] = v, e.scale[i] = h;
    } else {
      sum += v, h_sum += h, abs_sum += std::fabs(v);
    }
  }
  if (g.elementwise()) return {e};
  const double div = g.reduction == LossReduction::kMean ? static_cast<double>(n) : 1.0;
  e.ref[0] = sum / div;
  e.scale[0] = (h_sum + std::sqrt(static_cast<double>(n)) * abs_sum) / div;
  return {e};
}

// -t g or -exp(t) g, g = grad, grad (sum) or grad / n (mean): a couple of roundings of itself.
std::vector<Expect> kl_div_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const KlDivGeom g = kl_div_geometry(c).value();
  const Vec &t = in.at("target"), &gr = in.at("grad");
  const size_t n = t.size();
  Expect e{Vec(n), Vec(n)};
  for (size_t i = 0; i < n; ++i) {
    double gi = g.elementwise() ? gr[i] : gr[0];
    if (g.reduction == LossReduction::kMean) gi /= static_cast<double>(n);
    e.ref[i] = -gi * (g.log_target ? std::exp(t[i]) : t[i]);
    e.scale[i] = std::fabs(e.ref[i]);
  }
  return {e};
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

std::vector<Case> kl_cases(OpId op) {
  std::vector<Case> cs;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t r : {0, 1, 2})
      for (bool lt : {false, true}) {
        cs.push_back({op, {37, 1000}, dt, {{"reduction", r}, {"log_target", lt}}, 3});
        cs.push_back({op, {9, 77}, dt, {{"reduction", r}, {"log_target", lt}}, 1});
      }
  cs.push_back({op, {1}, DType::kF32, {{"reduction", 1}}, 1});
  cs.push_back({op, {4096, 1000}, DType::kBF16, {{"reduction", 1}}, 4, {{{"threads", 1024}, {"unroll", 4}}}});
  // KernelBench's KLDivLoss(reduction='batchmean'): aten's sum over (32768, 4096).
  for (DType dt : {DType::kF32, DType::kBF16}) cs.push_back({op, {32768, 4096}, dt, {{"reduction", 2}}, 1});
  return cs;
}

TEST_F(Gpu, KlDiv) { run_all(*this, kl_cases(OpId::kKlDiv), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, KlDiv) { EXPECT_GE(run_all(*this, kl_cases(OpId::kKlDiv), 2e-5, Rounding::kOnce), 14); }

TEST_F(Gpu, KlDivBackward) { run_all(*this, kl_cases(OpId::kKlDivBackward), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, KlDivBackward) { EXPECT_GE(run_all(*this, kl_cases(OpId::kKlDivBackward), 2e-5, Rounding::kOnce), 14); }

// Bandwidth at KernelBench's (32768, 4096), sum (batchmean), f32 and bf16: self and target read
// once (forward) or target read and grad_self written (backward). Prints.
TEST_F(Gpu, KlDivTimings) {
  const std::vector<Knobs> knobs = {{}, {{"blocks", 528}}, {{"blocks", 2112}}, {{"unroll", 4}}, {{"threads", 512}}};
  for (OpId op : {OpId::kKlDiv, OpId::kKlDivBackward})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::vector<int64_t> sizes = {32768, 4096};
      auto cr = make_call(op, sizes, dt, BackendKind::kCuda, {{"reduction", 2}});
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), knobs, 300, timed);
      ASSERT_FALSE(HasFatalFailure());
      const double bytes = 2.0 * sizes[0] * sizes[1] * dtype_size(dt);
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-16s %-6s 32768x4096 %-60s %8.4f ms %6.0f GB/s\n", op_info(op).name, dtype_name(dt),
                    tm.id.c_str(), tm.median_ms, bytes / (tm.median_ms * 1e6));
    }
}

}  // namespace
}  // namespace kc::evolve
