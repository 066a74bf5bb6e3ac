// Batch norm backward in the CUDA template GPU tests: the fp64 reference (template_gpu_reference.h)
// and the cases: training and eval, f32 and the halves (bf16 also with fp32 parameters), with and
// without a weight, every grad mask, the measured (16, 64, 256, 256) shape with several blocks per
// channel, odd planes (vec 1). grad_weight / grad_bias sum M = N x HxW terms per channel, so their
// scale grows with sqrt(M) over the sum of magnitudes. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {

std::vector<Expect> batch_norm_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec &x = in.at("input"), &dy = in.at("grad_out");
  const auto& sz = c.input("input")->sizes;
  const int64_t N = sz[0], C = sz[1], hw = static_cast<int64_t>(x.size()) / (N * C);
  const double M = static_cast<double>(N * hw), grow = 1 + std::sqrt(M) / 256;
  const bool train = c.int_arg("train", 1) != 0, has_w = c.input("weight")->defined;
  const double eps = c.double_arg("eps", 1e-5);
  std::vector<Expect> out(3);
  if (c.outputs[0].defined) out[0] = {Vec(x.size()), Vec(x.size())};
  for (int j = 1; j < 3; ++j)
    if (c.outputs[j].defined) out[j] = {Vec(C, 0.0), Vec(C, 0.0)};
  for (int64_t ch = 0; ch < C; ++ch) {
    const double mu = train ? in.at("save_mean")[ch] : in.at("running_mean")[ch];
    const double is = train ? in.at("save_invstd")[ch] : 1 / std::sqrt(in.at("running_var")[ch] + eps);
    const double a = is * (has_w ? in.at("weight")[ch] : 1.0);
    auto at = [&](int64_t n, int64_t j) { return static_cast<size_t>((n * C + ch) * hw + j); };
    double sd = 0, sda = 0, sx = 0, sxa = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t i = at(n, j);
        const double xh = (x[i] - mu) * is;
        sd += dy[i], sda += std::fabs(dy[i]), sx += dy[i] * xh, sxa += std::fabs(dy[i] * xh);
      }
    if (c.outputs[1].defined) out[1].ref[ch] = sx, out[1].scale[ch] = grow * sxa;
    if (c.outputs[2].defined) out[2].ref[ch] = sd, out[2].scale[ch] = grow * sda;
    if (!c.outputs[0].defined) continue;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t i = at(n, j);
        const double xh = (x[i] - mu) * is;
        out[0].ref[i] = train ? a * (dy[i] - sd / M - xh * sx / M) : a * dy[i];
        out[0].scale[i] = train ? std::fabs(a) * (std::fabs(dy[i]) + grow * (sda / M + std::fabs(xh) * sxa / M))
                                : std::fabs(a * dy[i]);
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

std::vector<Case> batch_norm_backward_cases() {
  const OpId op = OpId::kBatchNormBackward;
  const json train = {{"train", true}}, eval = {{"train", false}};
  std::vector<Case> cs;
  cs.push_back({op, {16, 64, 256, 256}, DType::kF32, train, 1, {{{"bpc", 8}}, {{"bpc", 1}, {"threads", 512}, {"vec", 2}}}});
  cs.push_back({op, {16, 64, 256, 256}, DType::kBF16, train, 1});
  cs.push_back({op, {16, 64, 256, 256}, DType::kBF16, {{"train", true}, {"param_dtype", "f32"}}, 1});
  cs.push_back({op, {16, 64, 256, 256}, DType::kF16, eval, 1});
  cs.push_back({op, {16, 64, 256, 256}, DType::kF32, eval, 1});
  cs.push_back({op, {3, 5, 7}, DType::kF32, train, 3});
  cs.push_back({op, {3, 5, 7}, DType::kF16, {{"train", true}, {"affine", false}}, 2});
  cs.push_back({op, {2, 4, 3, 3}, DType::kBF16, {{"train", false}, {"param_dtype", "f32"}}, 2});
  cs.push_back({op, {8, 6}, DType::kF32, eval, 2});
  cs.push_back({op, {1, 6, 70001}, DType::kF32, train, 2, {{{"bpc", 64}}}});
  for (const json& mask : {json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}, json{0, 1, 0}})
    for (bool tr : {true, false})
      cs.push_back({op, {4, 3, 33}, DType::kF32, {{"train", tr}, {"output_mask", mask}}, 2});
  return cs;
}

TEST_F(Gpu, BatchNormBackward) { run_all(*this, batch_norm_backward_cases(), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, BatchNormBackward) { EXPECT_GE(run_all(*this, batch_norm_backward_cases(), 2e-5, Rounding::kOnce), 9); }

}  // namespace
}  // namespace kc::evolve
