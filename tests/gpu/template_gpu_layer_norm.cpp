// Layer norm forward and backward in the CUDA template GPU tests: the fp64 references
// (template_gpu_reference.h) and the cases, f32 and the halves (8-wide vectors, N not a multiple
// of 8, odd N, the split row, with and without weight and bias, every grad mask). CUDA eager takes
// weight and bias in the input's dtype only, so there are no mixed-parameter cases. Outputs of a
// half call may be off by one rounding (half an ulp) of their own dtype beyond rtol * scale; mean
// and rstd are fp32. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {

// Layer norm forward and backward: M rows of N, fp64 from the (rounded) inputs; mean and rstd as
// the backward's inputs give them.
std::vector<Expect> layer_norm(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec& x = in.at("input");
  int64_t N = 1;
  for (int64_t s : c.list_arg("normalized_shape")) N *= s;
  const int64_t M = static_cast<int64_t>(x.size()) / N;
  const bool hw = c.input("weight")->defined, hb = c.input("bias")->defined;
  if (c.op == OpId::kLayerNorm) {
    const double eps = c.double_arg("eps", 1e-5);
    Expect y{Vec(x.size()), Vec(x.size())}, mean{Vec(M), Vec(M)}, rstd{Vec(M), Vec(M)};
    for (int64_t r = 0; r < M; ++r) {
      const double* xr = &x[r * N];
      double mu = 0, var = 0;
      for (int64_t j = 0; j < N; ++j) mu += xr[j];
      mu /= N;
      for (int64_t j = 0; j < N; ++j) var += (xr[j] - mu) * (xr[j] - mu);
      var /= N;
      const double rs = 1 / std::sqrt(var + eps);
      mean.ref[r] = mu;
      mean.scale[r] = std::fabs(mu) + std::sqrt(var);
      rstd.ref[r] = rs;
      rstd.scale[r] = rs * (1 + std::fabs(mu) * rs / 64);   // the mean's rounding moves var by ~eps*|mu|*std
      for (int64_t j = 0; j < N; ++j) {
        const double w = hw ? in.at("weight")[j] : 1, b = hb ? in.at("bias")[j] : 0, xh = (xr[j] - mu) * rs;
        y.ref[r * N + j] = xh * w + b;
        y.scale[r * N + j] = std::fabs(w) * (1 + std::fabs(xh) + std::fabs(mu) * rs / 64) + std::fabs(b);
      }
    }
    return {y, mean, rstd};
  }
  const Vec &g = in.at("grad_out"), &mu = in.at("mean"), &rs = in.at("rstd");
  std::vector<Expect> out(3);
  if (c.outputs[0].defined) out[0] = {Vec(x.size()), Vec(x.size())};
  if (c.outputs[1].defined) out[1] = {Vec(N, 0.0), Vec(N, 0.0)};
  if (c.outputs[2].defined) out[2] = {Vec(N, 0.0), Vec(N, 0.0)};
  for (int64_t r = 0; r < M; ++r) {
    double a = 0, b = 0, aa = 0, ba = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double w = hw ? in.at("weight")[j] : 1, wg = w * g[r * N + j], xh = (x[r * N + j] - mu[r]) * rs[r];
      a += wg;
      b += wg * xh;
      aa += std::fabs(wg);
      ba += std::fabs(wg * xh);
      if (c.outputs[1].defined) {
        out[1].ref[j] += g[r * N + j] * xh;
        out[1].scale[j] += std::fabs(g[r * N + j] * xh);
      }
      if (c.outputs[2].defined) {
        out[2].ref[j] += g[r * N + j];
        out[2].scale[j] += std::fabs(g[r * N + j]);
      }
    }
    if (!c.outputs[0].defined) continue;
    for (int64_t j = 0; j < N; ++j) {
      const double w = hw ? in.at("weight")[j] : 1, wg = w * g[r * N + j], xh = (x[r * N + j] - mu[r]) * rs[r];
      out[0].ref[r * N + j] = rs[r] * (wg - a / N - xh * b / N);
      out[0].scale[r * N + j] = rs[r] * (std::fabs(wg) + aa / N + std::fabs(xh) * (1 + ba / N));
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

// The half cases of op in dt: the transformer row (8 halves a load), N = 130 (pairs) and 131
// (single elements), odd rows without weight or bias, the 4M-element split row.
void halves(std::vector<Case>& cs, OpId op, DType dt) {
  const bool fwd = op == OpId::kLayerNorm;
  cs.push_back({op, {4096, 1024}, dt, {{"normalized_shape", {1024}}}, 3, {{{"threads", 32}, {"rows", 4}, {"vec", 8}}}});
  cs.push_back({op, {37, 130}, dt, {{"normalized_shape", {130}}}, 3});
  cs.push_back({op, {333, 131}, dt, {{"normalized_shape", {131}}}, 3});
  if (fwd) {
    cs.push_back({op, {3, 5}, dt, {{"normalized_shape", {5}}, {"affine", false}}, 2});
    cs.push_back({op, {3, 5}, dt, {{"normalized_shape", {5}}, {"bias", false}}, 2});
    cs.push_back({op, {2, 3, 4096}, dt, {{"normalized_shape", {3, 4096}}}, 2, {{{"split", 0}, {"regs", 0}}}});
    cs.push_back({op, {1, 64, 256, 256}, dt, {{"normalized_shape", {64, 256, 256}}}, 1, {{{"split", 132}, {"vec", 8}}}});
    return;
  }
  for (const json& mask : {json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}, json{0, 1, 0}})
    cs.push_back({op, {7, 5}, dt, {{"normalized_shape", {5}}, {"output_mask", mask}}, 2});
  cs.push_back({op, {33, 131}, dt, {{"normalized_shape", {131}}, {"affine", false}, {"output_mask", {1, 0, 0}}}, 2});
  cs.push_back({op, {2048, 1024}, dt, {{"normalized_shape", {1024}}}, 1,
                {{{"col_vec", 8}, {"col_ty", 16}, {"col_split", 8}}, {{"col_vec", 8}, {"col_split", 1}}}});
  cs.push_back({op, {3, 70000}, dt, {{"normalized_shape", {70000}}}, 1, {{{"split", 33}, {"vec", 8}}}});
}

std::vector<Case> layer_norm_cases() {
  std::vector<Case> cs;
  for (const json& a : {json{{"normalized_shape", {5}}}, json{{"normalized_shape", {5}}, {"affine", false}},
                        json{{"normalized_shape", {5}}, {"bias", false}}})
    cs.push_back({OpId::kLayerNorm, {3, 5}, DType::kF32, a, 2});
  cs.push_back({OpId::kLayerNorm, {37, 130}, DType::kF32, {{"normalized_shape", {130}}}, 6});
  cs.push_back({OpId::kLayerNorm, {4096, 1024}, DType::kF32, {{"normalized_shape", {1024}}}, 6});
  cs.push_back({OpId::kLayerNorm, {2, 3, 4096}, DType::kF32, {{"normalized_shape", {3, 4096}}, {"affine", false}}, 4,
                {{{"split", 0}}}});
  cs.push_back({OpId::kLayerNorm, {5, 70000}, DType::kF32, {{"normalized_shape", {70000}}}, 4,
                {{{"split", 33}, {"vec", 4}}, {{"split", 0}, {"threads", 1024}}}});
  cs.push_back({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32, {{"normalized_shape", {64, 256, 256}}}, 3,
                {{{"split", 132}}, {{"split", 1056}, {"threads", 512}}, {{"split", 0}}}});
  cs.push_back({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32,
                {{"normalized_shape", {64, 256, 256}}, {"affine", false}}, 1});
  for (DType dt : {DType::kBF16, DType::kF16}) halves(cs, OpId::kLayerNorm, dt);
  return cs;
}

TEST_F(Gpu, LayerNorm) { run_all(*this, layer_norm_cases(), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, LayerNorm) { EXPECT_GE(run_all(*this, layer_norm_cases(), 2e-5, Rounding::kOnce), 7); }

std::vector<Case> layer_norm_backward_cases() {
  std::vector<Case> cs;
  for (const json& mask : {json{1, 1, 1}, json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}}) {
    cs.push_back({OpId::kLayerNormBackward, {3, 5}, DType::kF32, {{"normalized_shape", {5}}, {"output_mask", mask}}, 2});
    cs.push_back({OpId::kLayerNormBackward, {1, 64, 256, 256}, DType::kF32,
                  {{"normalized_shape", {64, 256, 256}}, {"output_mask", mask}}, 1});
  }
  cs.push_back({OpId::kLayerNormBackward, {333, 131}, DType::kF32, {{"normalized_shape", {131}}}, 6,
                {{{"col_split", 8}, {"col_ty", 4}}}});
  cs.push_back({OpId::kLayerNormBackward, {4096, 1024}, DType::kF32, {{"normalized_shape", {1024}}}, 5});
  cs.push_back({OpId::kLayerNormBackward, {33, 131}, DType::kF32,
                {{"normalized_shape", {131}}, {"affine", false}, {"output_mask", {1, 0, 0}}}, 3});
  cs.push_back({OpId::kLayerNormBackward, {3, 70000}, DType::kF32, {{"normalized_shape", {70000}}}, 3,
                {{{"split", 33}}}});
  for (DType dt : {DType::kBF16, DType::kF16}) halves(cs, OpId::kLayerNormBackward, dt);
  return cs;
}

TEST_F(Gpu, LayerNormBackward) { run_all(*this, layer_norm_backward_cases(), 2e-5, Rounding::kOnce); }
TEST_F(Emulated, LayerNormBackward) { EXPECT_GE(run_all(*this, layer_norm_backward_cases(), 2e-5, Rounding::kOnce), 12); }

}  // namespace
}  // namespace kc::evolve
