// Embedding backward in the CUDA template GPU tests: indices with hot rows (long buckets) and
// padding_idx, the fp64 reference (each row the sum of its positions' grad rows, scale
// (1 + sqrt(count)) times their magnitudes: fp32 sums in position order) and the cases: GPT-2's
// vocabulary per dtype, int32 indices, three radix passes, scale_grad_by_freq, float atomics.
// run_all also checks two runs give the same bytes (but for the atomics). Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_ref {

Vec embedding_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0, 1);
  Vec v(t.numel());
  if (t.name != "indices") {
    for (auto& x : v) x = nd(rng);
    return v;
  }
  const int64_t W = c.int_arg("num_weights", 1), pad = c.int_arg("padding_idx", -1);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint64_t r = rng();
    v[i] = static_cast<double>(r % 4 == 0 ? r / 4 % std::min<int64_t>(W, 4) : r / 4 % W);
    if (i % 9 == 4 && pad >= 0) v[i] = static_cast<double>(pad);
  }
  return v;
}

std::vector<Expect> embedding_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec &g = in.at("grad_output"), &ix = in.at("indices");
  const int64_t W = c.int_arg("num_weights", 1), pad = c.int_arg("padding_idx", -1);
  const int64_t D = c.input("grad_output")->sizes.back(), n = static_cast<int64_t>(ix.size());
  const bool scale = c.int_arg("scale_grad_by_freq", 0) != 0;
  Expect e{Vec(W * D, 0.0), Vec(W * D, 0.0)};
  std::vector<double> cnt(W, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(ix[i]);
    if (k < 0 || k >= W || k == pad) continue;
    cnt[k] += 1;
    for (int64_t j = 0; j < D; ++j) e.ref[k * D + j] += g[i * D + j], e.scale[k * D + j] += std::fabs(g[i * D + j]);
  }
  for (int64_t w = 0; w < W; ++w)
    for (int64_t j = 0; j < D; ++j) {
      const double div = scale && cnt[w] > 0 ? cnt[w] : 1.0;
      e.ref[w * D + j] /= div;
      e.scale[w * D + j] = (1 + std::sqrt(cnt[w])) * e.scale[w * D + j] / div;
    }
  return {e};
}

namespace {

using nlohmann::json;
using gpu_run::Case;
using gpu_run::Emulated;
using gpu_run::Gpu;
using gpu_run::Rounding;
using gpu_run::run_all;

std::vector<Case> embedding_backward_cases() {
  const OpId op = OpId::kEmbeddingBackward;
  const json gpt2 = {{"num_weights", 50257}};
  std::vector<Case> cs;
  cs.push_back({op, {8192, 768}, DType::kF32, gpt2, 1, {{{"rows", 8}, {"sort_threads", 1024}, {"items", 2}}}});
  cs.push_back({op, {4, 2048, 1024}, DType::kBF16, {{"num_weights", 50257}, {"padding_idx", 0}}, 1});
  cs.push_back({op, {8192, 768}, DType::kF16, {{"num_weights", 50257}, {"index_dtype", "i32"}}, 1});
  cs.push_back({op, {3, 11, 7}, DType::kF32, {{"num_weights", 300000}, {"padding_idx", 5}, {"scale_grad_by_freq", true}}, 1});
  cs.push_back({op, {700, 64}, DType::kF32, {{"num_weights", 6}, {"padding_idx", 1}, {"scale_grad_by_freq", true}}, 2,
                {{{"sort_threads", 128}}}});
  // Float atomics: hot rows (a quarter of the positions on 4 rows), padding_idx, int32 indices,
  // a row not a multiple of 4 (vec 1); element by element and in float4 / float2 vectors.
  cs.push_back({op, {8192, 768}, DType::kF32, gpt2, 0,
                {{{"atomic", 1}}, {{"atomic", 1}, {"rows", 1}, {"vec", 2}}, {{"atomic", 2}}, {{"atomic", 2}, {"vec", 2}}}});
  cs.push_back({op, {3, 700, 67}, DType::kF32, {{"num_weights", 1000}, {"padding_idx", 2}, {"index_dtype", "i32"}}, 0,
                {{{"atomic", 1}}, {{"atomic", 2}}}});
  // Small enough for the emulation: the sort's two kernels (chunked and not), the atomics, halves.
  const json small = {{"num_weights", 300}, {"padding_idx", 3}};
  cs.push_back({op, {2, 90, 40}, DType::kF32, small, 1, {{{"chunk", 0}}, {{"chunk", 4}, {"sort_threads", 128}}, {{"atomic", 1}}, {{"atomic", 2}}}});
  cs.push_back({op, {130, 24}, DType::kBF16, {{"num_weights", 600}, {"scale_grad_by_freq", true}}, 1, {{{"chunk", 0}}}});
  return cs;
}

TEST_F(Gpu, EmbeddingBackward) { run_all(*this, embedding_backward_cases(), 1e-6, Rounding::kOnce); }
TEST_F(Emulated, EmbeddingBackward) { EXPECT_GE(run_all(*this, embedding_backward_cases(), 1e-6, Rounding::kOnce), 3); }

}  // namespace
}  // namespace kc::evolve::gpu_ref
