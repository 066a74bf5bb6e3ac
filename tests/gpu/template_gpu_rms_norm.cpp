// RMSNorm in the CUDA template GPU tests: the inputs (rows with their own scale, a row of zeros
// where there are several: rstd is then 1/sqrt(eps)), the fp64 references of the forward (out,
// rstd) and the backward (grad_input, grad_weight from the given rstd) with per-element scales
// of the magnitudes summed, the cases (every candidate of the knob space is sampled over the
// shapes: warp and block rows, split long rows, odd columns, weight or none, every mask), and the
// achieved bandwidth of the default and a few settings. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "evolve/ops/rms_norm.h"
#include "evolve/propose/proposer.h"
#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {

Vec rms_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  std::normal_distribution<double> nd(0, 1);
  std::uniform_real_distribution<double> ud(-1, 1);
  Vec v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i) / g.cols;
    if (t.name == "weight") v[i] = 1 + 0.5 * ud(rng);
    else if (t.name == "grad") v[i] = nd(rng);
    else v[i] = (r % 3 == 1 ? 30.0 : 1.0) * nd(rng) + (r % 4 == 2 ? 2.0 : 0.0);
  }
  if (t.name == "input" && g.rows > 3)
    for (int64_t j = 0; j < g.cols; ++j) v[3 * g.cols + j] = 0;
  for (auto& x : v) x = Host::round(t.dtype, x);
  return v;
}

Vec rms_rstd(const OpCall& c, const std::map<std::string, Vec>& in) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  const Vec& x = in.at("input");
  Vec v(g.rows);
  for (int64_t r = 0; r < g.rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < g.cols; ++j) s += x[r * g.cols + j] * x[r * g.cols + j];
    v[r] = Host::round(DType::kF32, 1 / std::sqrt(s / g.cols + g.eps));
  }
  return v;
}

std::vector<Expect> rms_norm(const OpCall& c, const std::map<std::string, Vec>& in) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  const Vec& x = in.at("input");
  const Vec rs = rms_rstd(c, in);   // fp32-rounded: within the tolerance of the exact value
  Expect out{Vec(x.size()), Vec(x.size())}, rstd{Vec(g.rows), Vec(g.rows)};
  for (int64_t r = 0; r < g.rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < g.cols; ++j) s += x[r * g.cols + j] * x[r * g.cols + j];
    const double e = 1 / std::sqrt(s / g.cols + g.eps);
    rstd.ref[r] = e, rstd.scale[r] = e;
    for (int64_t j = 0; j < g.cols; ++j) {
      const size_t i = r * g.cols + j;
      const double w = g.weighted ? in.at("weight")[j] : 1.0;
      out.ref[i] = x[i] * e * w, out.scale[i] = std::fabs(x[i] * e * w);
    }
  }
  return {out, rstd};
}

std::vector<Expect> rms_norm_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  const Vec &x = in.at("input"), &gr = in.at("grad"), &rs = in.at("rstd");
  Expect gi, gw;
  if (g.want_input) gi = {Vec(x.size()), Vec(x.size())};
  if (g.want_weight) gw = {Vec(g.cols, 0.0), Vec(g.cols, 0.0)};
  for (int64_t r = 0; r < g.rows; ++r) {
    double b = 0, ab = 0;
    auto w = [&](int64_t j) { return g.weighted ? in.at("weight")[j] : 1.0; };
    for (int64_t j = 0; j < g.cols; ++j) {
      const size_t i = r * g.cols + j;
      b += gr[i] * w(j) * x[i] * rs[r], ab += std::fabs(gr[i] * w(j) * x[i] * rs[r]);
    }
    for (int64_t j = 0; j < g.cols; ++j) {
      const size_t i = r * g.cols + j;
      const double a = gr[i] * w(j), xh = x[i] * rs[r];
      if (g.want_input) gi.ref[i] = rs[r] * (a - xh * b / g.cols), gi.scale[i] = rs[r] * (std::fabs(a) + std::fabs(xh) * ab / g.cols);
      if (g.want_weight) gw.ref[j] += gr[i] * xh, gw.scale[j] += std::fabs(gr[i] * xh);
    }
  }
  return {gi, gw};
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

std::vector<Case> rms_cases(OpId op) {
  std::vector<Case> cs;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    cs.push_back({op, {37, 1000}, dt, json::object(), 6});
    cs.push_back({op, {9, 77}, dt, {{"weight", false}}, 3});
    cs.push_back({op, {64, 4096}, dt, json::object(), 6, {{{"threads", 1024}, {"regs", 0}}}});
  }
  cs.push_back({op, {1, 1}, DType::kF32, json::object(), 1});
  cs.push_back({op, {1, 128256}, DType::kBF16, json::object(), 4, {{{"split", 0}}}});
  cs.push_back({op, {4, 64, 1024}, DType::kBF16, {{"normalized_shape", {64, 1024}}}, 3});
  cs.push_back({op, {65536, 128}, DType::kF32, json::object(), 2});
  if (op == OpId::kRmsNormBackward)
    for (const json& m : {json{1, 0}, json{0, 1}}) cs.push_back({op, {300, 520}, DType::kBF16, {{"output_mask", m}}, 4});
  return cs;
}

TEST_F(Gpu, RmsNorm) { run_all(*this, rms_cases(OpId::kRmsNorm), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, RmsNorm) { EXPECT_GE(run_all(*this, rms_cases(OpId::kRmsNorm), 2e-5, Rounding::kOnce), 3); }

TEST_F(Gpu, RmsNormBackward) { run_all(*this, rms_cases(OpId::kRmsNormBackward), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, RmsNormBackward) { EXPECT_GE(run_all(*this, rms_cases(OpId::kRmsNormBackward), 2e-5, Rounding::kOnce), 3); }

// Bandwidth at 8192 x 4096 bf16 and 8192 x 1024 fp32 (forward: input read, out written; backward:
// grad and input read, grad_input written, grad_weight's second read counted as moved). Prints.
TEST_F(Gpu, RmsNormTimings) {
  const std::vector<Knobs> knobs = {{}, {{"threads", 256}}, {{"threads", 512}, {"regs", 0}}, {{"threads", 32}, {"regs", 0}}};
  for (OpId op : {OpId::kRmsNorm, OpId::kRmsNormBackward})
    for (const auto& [sizes, dt] : std::vector<std::pair<std::vector<int64_t>, DType>>{{{8192, 4096}, DType::kBF16},
                                                                                     {{8192, 1024}, DType::kF32}}) {
      auto cr = make_call(op, sizes, dt, BackendKind::kCuda, json::object());
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), knobs, 300, timed);
      ASSERT_FALSE(HasFatalFailure());
      const double bytes = 8192.0 * sizes[1] * dtype_size(dt) * (op == OpId::kRmsNorm ? 2 : 5);
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-18s %-6s %-12s %-70s %8.4f ms %6.0f GB/s\n", op_info(op).name, dtype_name(dt),
                    (std::to_string(sizes[0]) + "x" + std::to_string(sizes[1])).c_str(), tm.id.c_str(), tm.median_ms,
                    bytes / (tm.median_ms * 1e6));
    }
}

}  // namespace
}  // namespace kc::evolve
