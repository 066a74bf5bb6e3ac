// The CPU template tests' embedding backward: indices with hot rows, padding_idx and out-of-range
// values (they reach no row) in the float buffers that hold their bytes, and the fp64 reference
// of each output row, the sum of its positions' grad rows (scale sqrt(count) times their
// magnitudes, as the gauntlet's model).
#include <cmath>
#include <cstring>
#include <random>

#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve::cpu_ref {
namespace {

bool i32(const OpCall& c) { return c.input("indices")->dtype == DType::kI32; }

int64_t get_index(const OpCall& c, const std::vector<float>& buf, size_t i) {
  if (i32(c)) {
    int32_t v;
    std::memcpy(&v, &buf[i], 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, &buf[2 * i], 8);
  return v;
}

}  // namespace

void embedding_backward_inputs(const OpCall& c, Buffers& b, uint64_t seed) {
  const int64_t n = c.input("indices")->numel(), W = c.int_arg("num_weights", 1), pad = c.int_arg("padding_idx", -1);
  std::mt19937_64 rng(seed);
  auto& t = b["indices"];
  t.assign(static_cast<size_t>(n) * (i32(c) ? 1 : 2), 0.f);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    int64_t v = r % 3 == 0 ? static_cast<int64_t>(r / 3 % std::min<int64_t>(W, 3)) : static_cast<int64_t>(r / 3 % W);
    if (i % 7 == 5) v = pad;
    if (i % 31 == 30) v = W + 2;   // out of range: no row (ATen's CPU kernel skips it too)
    if (i32(c)) {
      const int32_t q = static_cast<int32_t>(v);
      std::memcpy(&t[i], &q, 4);
    } else {
      std::memcpy(&t[2 * i], &v, 8);
    }
  }
}

void embedding_backward(const OpCall& c, Buffers& b, std::vector<Expect>& out) {
  Expect& e = out[0];
  e.k = 16;
  const int64_t n = c.input("indices")->numel(), W = c.int_arg("num_weights", 1), pad = c.int_arg("padding_idx", -1);
  const int64_t D = c.input("grad_output")->sizes.back();
  const bool scale = c.int_arg("scale_grad_by_freq", 0) != 0;
  const std::vector<float>& g = b["grad_output"];
  std::vector<double> cnt(W, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = get_index(c, b["indices"], i);
    if (k < 0 || k >= W || k == pad) continue;
    cnt[k] += 1;
    for (int64_t j = 0; j < D; ++j) {
      e.ref[k * D + j] += g[i * D + j];
      e.scale[k * D + j] += std::fabs(g[i * D + j]);
    }
  }
  for (int64_t w = 0; w < W; ++w)
    for (int64_t j = 0; j < D; ++j) {
      double& r = e.ref[w * D + j];
      double& s = e.scale[w * D + j];
      if (scale && cnt[w] > 0) r /= cnt[w], s /= cnt[w];
      s = (std::sqrt(cnt[w]) + 1) * s + std::fabs(r);
    }
}

}  // namespace kc::evolve::cpu_ref
