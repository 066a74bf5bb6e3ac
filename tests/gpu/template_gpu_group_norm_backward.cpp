// Group norm backward in the CUDA template GPU tests: the fp64 reference and inputs
// (template_gpu_reference.h) and the cases: f32 and the halves (bf16 also with fp32 parameters and
// statistics), with and without a weight, every grad mask, the measured (16, 64, 256, 256) shape
// with 8 groups and several blocks per plane, U-Net shapes, HxW = 1 and odd planes (vec 1).
// grad_input sums K = C / group x HxW terms per row and grad_weight / grad_bias M = N x HxW per
// channel, so their scales grow with sqrt(K) and sqrt(M). Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {

// Rows (n, g) with their own offset and spread, mean near the row's offset, a positive rstd.
Vec group_norm_backward_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0, 1);
  std::uniform_real_distribution<double> ud(-1, 1);
  const int64_t n = t.numel(), rows = c.input("mean")->numel(), K = c.input("input")->numel() / std::max<int64_t>(1, rows);
  auto offset = [](int64_t r) { return r % 4 == 3 ? 100.0 : 3.0 * (r % 3); };
  Vec v(n);
  for (int64_t i = 0; i < n; ++i) {
    if (t.name == "input") v[i] = offset(i / K) + (1 + (i / K) % 2) * nd(rng);
    else if (t.name == "mean") v[i] = offset(i) + 0.1 * nd(rng);
    else if (t.name == "rstd") v[i] = 0.1 + std::fabs(2 * nd(rng));
    else if (t.name == "weight") v[i] = 1 + 0.5 * ud(rng);
    else v[i] = nd(rng);
  }
  return v;
}

std::vector<Expect> group_norm_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec &x = in.at("input"), &dy = in.at("grad_out"), &mu = in.at("mean"), &rs = in.at("rstd");
  const int64_t N = c.int_arg("N", 0), C = c.int_arg("C", 0), hw = c.int_arg("HxW", 0), G = c.int_arg("group", 1);
  const int64_t D = C / G, K = D * hw;
  const double grow_k = 1 + std::sqrt(static_cast<double>(K)) / 256, grow_m = 1 + std::sqrt(static_cast<double>(N * hw)) / 256;
  const bool has_w = c.input("weight")->defined;
  std::vector<Expect> out(3);
  if (c.outputs[0].defined) out[0] = {Vec(x.size()), Vec(x.size())};
  for (int j = 1; j < 3; ++j)
    if (c.outputs[j].defined) out[j] = {Vec(C, 0.0), Vec(C, 0.0)};
  for (int64_t r = 0; r < N * G; ++r) {
    double a = 0, aa = 0, p = 0, pa = 0;
    auto at = [&](int64_t j) { return static_cast<size_t>(r * K + j); };
    auto chan = [&](int64_t j) { return (r % G) * D + j / hw; };
    for (int64_t j = 0; j < K; ++j) {
      const size_t i = at(j);
      const double w = has_w ? in.at("weight")[chan(j)] : 1.0, xh = (x[i] - mu[r]) * rs[r];
      a += w * dy[i], aa += std::fabs(w * dy[i]), p += w * dy[i] * xh, pa += std::fabs(w * dy[i] * xh);
      if (c.outputs[1].defined) out[1].ref[chan(j)] += dy[i] * xh, out[1].scale[chan(j)] += grow_m * std::fabs(dy[i] * xh);
      if (c.outputs[2].defined) out[2].ref[chan(j)] += dy[i], out[2].scale[chan(j)] += grow_m * std::fabs(dy[i]);
    }
    if (!c.outputs[0].defined) continue;
    for (int64_t j = 0; j < K; ++j) {
      const size_t i = at(j);
      const double w = has_w ? in.at("weight")[chan(j)] : 1.0, xh = (x[i] - mu[r]) * rs[r];
      out[0].ref[i] = rs[r] * (w * dy[i] - a / K - xh * p / K);
      out[0].scale[i] = rs[r] * (std::fabs(w * dy[i]) + grow_k * (aa / K + std::fabs(xh) * pa / K));
    }
  }
  return out;
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

std::vector<Case> group_norm_backward_cases() {
  const OpId op = OpId::kGroupNormBackward;
  const json g8 = {{"group", 8}}, g32 = {{"group", 32}};
  std::vector<Case> cs;
  cs.push_back({op, {16, 64, 256, 256}, DType::kF32, g8, 1,
                {{{"bpp", 4}}, {{"bpp", 1}, {"threads", 512}, {"vec", 2}, {"rev", 0}}, {{"unroll", 8}, {"items", 8}}}});
  cs.push_back({op, {16, 64, 256, 256}, DType::kBF16, g8, 1});
  cs.push_back({op, {16, 64, 256, 256}, DType::kF16, g8, 1});
  cs.push_back({op, {8, 320, 64, 64}, DType::kF32, g32, 2});
  cs.push_back({op, {8, 1280, 16, 16}, DType::kBF16, {{"group", 32}, {"param_dtype", "f32"}}, 2});
  cs.push_back({op, {32, 64, 56, 56}, DType::kF16, g32, 2, {{{"threads", 32}}}});
  cs.push_back({op, {3, 6, 7}, DType::kF32, {{"group", 3}}, 3});
  cs.push_back({op, {3, 6, 7}, DType::kF16, {{"group", 2}, {"affine", false}}, 2});
  cs.push_back({op, {8, 6}, DType::kF32, {{"group", 3}}, 2});
  cs.push_back({op, {1, 4, 70001}, DType::kF32, {{"group", 2}}, 2, {{{"bpp", 64}}}});
  for (const json& mask : {json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}, json{0, 1, 0}})
    cs.push_back({op, {4, 6, 33}, DType::kF32, {{"group", 3}, {"output_mask", mask}}, 2});
  return cs;
}

TEST_F(Gpu, GroupNormBackward) { run_all(*this, group_norm_backward_cases(), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, GroupNormBackward) { EXPECT_GE(run_all(*this, group_norm_backward_cases(), 2e-5, Rounding::kOnce), 5); }

}  // namespace
}  // namespace kc::evolve
