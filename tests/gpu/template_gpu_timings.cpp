// Timings of CUDA template defaults and chosen knobs on a real GPU (printed medians and GB/s, one
// bound: the split layer norm of one 4M-element row), through time_candidates (template_gpu_run.h).
// Skips without a device. Speed claims live in benchmarks/; the bound only guards the default split
// of the one layout where eager is pathological (8.65 ms, docs/PERF.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/proposer.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve {
namespace {

using nlohmann::json;
using gpu_run::Gpu;

const json kNone = json::object();

TEST_F(Gpu, Timings) {
  struct T {
    OpId op;
    std::vector<int64_t> sizes;
    json args;
    std::vector<Knobs> knobs;
    double bytes;   // memory traffic of one call, for GB/s
  };
  const double big = 64.0 * 256 * 256 * 4;
  std::vector<T> ts = {
      {OpId::kLayerNorm, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}},
       {{}, {{"split", 264}}, {{"split", 528}, {"threads", 512}}, {{"split", 1056}}, {{"split", 1056}, {"threads", 512}}},
       2 * big},
      {OpId::kLayerNorm, {4096, 1024}, {{"normalized_shape", {1024}}}, {{}}, 2 * 4096.0 * 1024 * 4},
      {OpId::kLayerNorm, {16 * 1024, 4096}, {{"normalized_shape", {4096}}}, {{}}, 2 * 16384.0 * 4096 * 4},
      {OpId::kLayerNormBackward, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}}, {{}}, 3 * big + 2 * 4 * 64 * 65536},
      {OpId::kLayerNormBackward, {4096, 1024}, {{"normalized_shape", {1024}}}, {{}}, 3 * 4096.0 * 1024 * 4},
      {OpId::kSoftmax, {4096, 1024}, kNone, {{}}, 2 * 4096.0 * 1024 * 4},
      {OpId::kGelu, {1 << 26}, kNone, {{}}, 2 * 4.0 * (1 << 26)},
      // Group norm: the split (two reads of a row larger than L2) against the fused cluster launch
      // (one read from DRAM, the second from L2, when the resident slices fit there).
      {OpId::kGroupNorm, {16, 64, 256, 256}, {{"group", 8}},
       {{}, {{"split", 66}}, {{"split", 132}}, {{"split", 264}}, {{"split", 132}, {"threads", 512}},
        {{"fuse", 8}, {"threads", 1024}, {"resident", 1}}, {{"fuse", 8}, {"threads", 512}, {"resident", 2}},
        {{"fuse", 8}, {"threads", 256}}, {{"fuse", 4}, {"threads", 1024}, {"resident", 1}}},
       2 * 16 * big},
      {OpId::kGroupNorm, {8, 320, 64, 64}, {{"group", 32}},
       {{}, {{"split", 33}}, {{"split", 0}, {"fuse", 0}}, {{"fuse", 1}, {"threads", 1024}, {"resident", 1}}, {{"fuse", 1}, {"threads", 512}, {"resident", 2}},
        {{"fuse", 2}, {"threads", 512}, {"resident", 2}}, {{"fuse", 1}, {"threads", 256}, {"resident", 0}},
        {{"fuse", 2}, {"threads", 256}, {"resident", 0}}, {{"fuse", 4}, {"threads", 1024}, {"regs", 1}},
        {{"fuse", 8}, {"threads", 512}, {"regs", 1}}},
       2 * 8.0 * 320 * 4096 * 4},
      {OpId::kGroupNorm, {8, 1280, 16, 16}, {{"group", 32}}, {{}}, 2 * 8.0 * 1280 * 256 * 4},
      {OpId::kGroupNorm, {32, 64, 56, 56}, {{"group", 32}}, {{}, {{"regs", 0}}, {{"fuse", 1}, {"threads", 256}}},
       2 * 32.0 * 64 * 3136 * 4},
      {OpId::kMseLoss, {1 << 24}, kNone, {{}, {{"blocks", 528}}, {{"blocks", 2112}}}, 2 * 4.0 * (1 << 24)},
      {OpId::kNllLoss, {4096, 32000}, kNone, {{}}, 4096.0 * (8 + 4)},
  };
  for (const T& t : ts) {
    auto cr = make_call(t.op, t.sizes, DType::kF32, BackendKind::kCuda, t.args);
    ASSERT_TRUE(cr.is_ok());
    std::vector<gpu_run::Timed> timed;
    gpu_run::time_candidates(*this, cr.value(), t.knobs, 200, timed);
    ASSERT_FALSE(HasFatalFailure());
    for (const gpu_run::Timed& tm : timed) {
      std::printf("%-28s %-70s %8.4f ms  %6.0f GB/s\n", (std::string(op_info(t.op).name) + " " + json(t.sizes).dump()).c_str(),
                  tm.id.c_str(), tm.median_ms, t.bytes / (tm.median_ms * 1e6));
      if (t.op == OpId::kLayerNorm && t.sizes.size() == 4 && tm.knobs.empty()) {
        EXPECT_LT(tm.median_ms, 0.2) << "the default split layer norm of one 4M-element row";
      }
    }
  }
}

// Pooling strips (`rows`) against one output row a thread, max pooling with and without its index
// output, var_mean's chunked Welford, and short rows (7x7 planes) in groups of fewer lanes, in
// fp32 and bf16 at the shapes where they trailed torch.compile (docs/PERF.md); printed only.
TEST_F(Gpu, TimingsPoolVar) {
  struct T {
    OpId op;
    std::vector<int64_t> sizes;
    json args;
    std::vector<Knobs> knobs;
    double elems_in, elems_out;   // elements read and written (max pooling adds 8-byte indices)
  };
  const json s1 = {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}, stem = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}};
  const json k4 = {{"kernel_size", 4}, {"stride", 1}, {"padding", 1}};
  const json d1 = {{"kernel_size", {1, 8}}, {"stride", {1, 1}}, {"padding", {0, 4}}, {"dilation", {1, 3}}};
  const double a2 = 16.0 * 64 * 256 * 256, r = 16.0 * 4096 * 1023;
  // Register spans read in vectors of 4 (fp32) or 8 (16-bit) elements; the other renders are
  // unsupported in that dtype and skipped.
  const Knobs v4 = {{"regs", 1}, {"vpt", 4}, {"vl", 4}}, v8 = {{"regs", 1}, {"vpt", 8}, {"vl", 8}},
              w8 = {{"regs", 1}, {"vpt", 4}, {"vl", 8}};
  auto with = [](Knobs k, int64_t rows) { k["rows"] = rows; return k; };
  auto staged = [](Knobs k) { k["stage"] = 1; return k; };   // stores through shared memory (kc_stage)
  auto vstore = [](Knobs k) { k["vst"] = 1; return k; };      // aligned vector stores, no exchange (kc_put)
  const std::vector<T> ts = {
      {OpId::kAvgPool2d, {16, 64, 256, 256}, s1,
       {{}, {{"vpt", 2}, {"regs", 1}}, {{"rows", 4}, {"vpt", 2}, {"regs", 1}}, staged({{"rows", 4}, {"vpt", 2}, {"regs", 1}}),
        with(v4, 4), staged(with(v4, 4)), with(v8, 4), staged(with(v8, 4)), staged(with(v4, 1)), staged({{"rows", 4}, {"vpt", 4}, {"il", 0}}),
        vstore(with(v4, 4)), vstore(with(v8, 4)), vstore(with(v4, 1))},
       a2, a2},
      {OpId::kMaxPool2d, {32, 64, 112, 112}, stem,
       {{}, {{"rows", 4}}, {{"rows", 4}, {"vpt", 1}}, {{"rows", 4}, {"vpt", 4}}, with(v4, 1), with(w8, 1), with(w8, 4)},
       32.0 * 64 * 112 * 112, 32.0 * 64 * 56 * 56},
      {OpId::kMaxPool2d, {16, 32, 256, 256}, k4, {{}, {{"rows", 2}}, {{"rows", 4}}, {{"rows", 4}, {"vpt", 1}}},
       16.0 * 32 * 256 * 256, 16.0 * 32 * 255 * 255},
      // The values alone (no index output), as aten::max_pool2d is served when no gradient is wanted.
      {OpId::kMaxPool2dValues, {32, 64, 112, 112}, stem, {{}, {{"rows", 4}}, with(v4, 1), with(w8, 1), with(w8, 4)},
       32.0 * 64 * 112 * 112, 32.0 * 64 * 56 * 56},
      {OpId::kMaxPool2dValues, {16, 32, 256, 256}, k4, {{}, with(v4, 4), staged(with(v4, 4)), with(v8, 4), staged(with(v8, 4)), vstore(with(v4, 4)), vstore(with(v8, 4))},
       16.0 * 32 * 256 * 256, 16.0 * 32 * 255 * 255},
      // max_pool1d (kernel 8, stride 1, padding 4, dilation 3), served through the 2d kernels on a
      // one-high plane, where bf16 ran at 24% of copy and behind torch.compile (docs/PERF.md).
      {OpId::kMaxPool2dValues, {64, 192, 1, 16384}, d1,
       {{}, v4, staged(v4), {{"regs", 1}, {"vpt", 8}, {"vl", 4}}, staged({{"regs", 1}, {"vpt", 8}, {"vl", 4}}),
        staged({{"regs", 1}, {"vpt", 8}, {"vl", 4}, {"threads", 128}}), staged({{"regs", 1}, {"vpt", 2}, {"vl", 2}}),
        vstore(v4), vstore({{"regs", 1}, {"vpt", 8}, {"vl", 4}}), vstore({{"regs", 1}, {"vpt", 8}, {"vl", 4}, {"threads", 128}})},
       64.0 * 192 * 16384, 64.0 * 192 * 16371},
      // 3D video's 2x2x2 stride 2: no span without vectors (the windows do not overlap).
      {OpId::kMaxPool3dValues, {8, 64, 16, 112, 112}, {{"kernel_size", 2}, {"stride", 2}}, {{}, v4, staged(v4), w8, staged(w8), vstore(v4), vstore(w8)},
       8.0 * 64 * 16 * 112 * 112, 8.0 * 64 * 8 * 56 * 56},
      {OpId::kVarMean, {16, 4096, 1023}, {{"dim", -1}}, {{}, {{"unroll", 8}}, {{"rows", 8}}, {{"rows", 2}}, {{"threads", 64}}},
       r, 2 * 16.0 * 4096},
      // Two runs (batch-norm statistics): rows of 3136 folded by a warp, a block, a big block.
      {OpId::kVarMean, {32, 256, 56, 56}, {{"dim", {0, 2, 3}}},
       {{}, {{"threads", 32}, {"rows", 4}}, {{"threads", 256}}, {{"threads", 1024}}, {{"unroll", 8}}}, 32.0 * 256 * 56 * 56, 512},
      // Rows of 49 (7x7 planes): groups of 4 to 16 lanes, several rows a warp, against a warp a row.
      {OpId::kVarMean, {32, 2048, 7, 7}, {{"dim", {0, 2, 3}}},
       {{}, {{"threads", 32}, {"rows", 8}}, {{"threads", 32}, {"rows", 4}}, {{"threads", 4}}, {{"threads", 16}}}, 32.0 * 2048 * 49, 4096},
      {OpId::kMean, {32, 2048, 7, 7}, {{"dim", {2, 3}}},
       {{}, {{"threads", 32}, {"rows", 4}}, {{"threads", 4}}, {{"threads", 16}}, {{"threads", 8}, {"rows", 8}}}, 32.0 * 2048 * 49,
       32.0 * 2048},
      // ResNet's head through _adaptive_avg_pool2d (cuda.pool_global): planes of 49 in groups of
      // 4 to 16 lanes (the default: 8) against a warp a plane.
      {OpId::kAdaptiveAvgPool2d, {32, 2048, 7, 7}, {{"output_size", 1}},
       {{}, {{"threads", 32}, {"rows", 4}}, {{"threads", 4}}, {{"threads", 16}}, {{"threads", 8}, {"rows", 8}}}, 32.0 * 2048 * 49,
       32.0 * 2048},
  };
  for (DType dt : {DType::kF32, DType::kBF16})
    for (const T& t : ts) {
      auto cr = make_call(t.op, t.sizes, dt, BackendKind::kCuda, t.args);
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), t.knobs, 200, timed);
      ASSERT_FALSE(HasFatalFailure());
      const double es = dt == DType::kF32 ? 4 : 2;
      const double bytes = (t.elems_in + t.elems_out) * es + (t.op == OpId::kMaxPool2d ? 8 * t.elems_out : 0);
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-14s %-4s %-24s %-80s %8.4f ms  %6.0f GB/s\n", op_info(t.op).name, dtype_name(dt),
                    json(t.sizes).dump().c_str(), tm.id.c_str(), tm.median_ms, bytes / (tm.median_ms * 1e6));
    }
}

// Reductions of (16, 4096, 1023), the single-op shape whose odd extent misaligns every row: over
// the last dim (rows kernels: a misaligned head and tail, vectors between) and over dim 1 (column
// kernels, where 1023 columns allow no vectors), where several trailed torch.compile (docs/PERF.md).
// Printed only; `KC_TIMING_ONCE=1 ncu -k regex:kc_red ...` profiles each setting once.
TEST_F(Gpu, TimingsOddReductions) {
  const double r = 16.0 * 4096 * 1023;
  const std::vector<Knobs> rows = {{},
                                   {{"unroll", 2}},
                                   {{"threads", 64}},
                                   {{"threads", 16}},
                                   {{"threads", 16}, {"unroll", 2}},
                                   {{"threads", 8}},
                                   {{"threads", 8}, {"unroll", 2}},
                                   {{"threads", 16}, {"rows", 8}}};
  const std::vector<Knobs> cols = {{}, {{"split", 0}}, {{"tx", 32}, {"ty", 8}}, {{"tx", 128}, {"ty", 8}}, {{"unroll", 8}}};
  const std::vector<std::tuple<OpId, int, std::vector<Knobs>>> ts = {
      {OpId::kVarMean, -1, rows}, {OpId::kMean, -1, rows},  {OpId::kMin, -1, rows}, {OpId::kSum, 1, cols},
      {OpId::kVar, 1, cols},      {OpId::kProd, 1, cols},   {OpId::kAmax, 1, cols},   {OpId::kArgmax, 1, cols},
  };
  for (DType dt : {DType::kBF16, DType::kF32})
    for (const auto& [op, dim, knobs] : ts) {
      auto cr = make_call(op, {16, 4096, 1023}, dt, BackendKind::kCuda, {{"dim", dim}});
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), knobs, 200, timed);
      ASSERT_FALSE(HasFatalFailure());
      const double bytes = r * (dt == DType::kF32 ? 4 : 2);
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-10s dim %2d %-4s %-80s %8.4f ms  %6.0f GB/s\n", op_info(op).name, dim, dtype_name(dt), tm.id.c_str(),
                    tm.median_ms, bytes / (tm.median_ms * 1e6));
    }
}

// cuda.unary's fast math against the precise bodies in bf16 and fp16 (16, 1024, 4096): the
// activations whose libm calls bound eager below the copy bandwidth.
TEST_F(Gpu, TimingsFastMath) {
  const double n = 16.0 * 1024 * 4096;
  for (DType dt : {DType::kBF16, DType::kF16})
    for (const auto& [op, args] : std::vector<std::pair<OpId, json>>{{OpId::kSoftplus, json::object()},
                                                                     {OpId::kMish, json::object()},
                                                                     {OpId::kElu, json::object()},
                                                                     {OpId::kGelu, {{"approximate", "tanh"}}},
                                                                     {OpId::kGelu, json::object()},
                                                                     {OpId::kSilu, json::object()},
                                                                     {OpId::kTanh, json::object()}}) {
      auto cr = make_call(op, {16, 1024, 4096}, dt, BackendKind::kCuda, args);
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), {{{"math", 0}}, {{"math", 1}}}, 200, timed);
      ASSERT_FALSE(HasFatalFailure());
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-14s %-4s %-60s %8.4f ms  %6.0f GB/s\n", op_info(op).name, dtype_name(dt), tm.id.c_str(),
                    tm.median_ms, 2 * n * 2 / (tm.median_ms * 1e6));
    }
  // Softmax over rows of GPT-2's attention (8x12 heads of 1024x1024), where eager bf16 ran at 62%
  // of copy on the H200: precise vs fast math, the row in registers and online.
  for (DType dt : {DType::kBF16, DType::kF16})
    for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax}) {
      auto cr = make_call(op, {96 * 1024, 1024}, dt, BackendKind::kCuda, json::object());
      ASSERT_TRUE(cr.is_ok()) << cr.status().to_string();
      std::vector<gpu_run::Timed> timed;
      gpu_run::time_candidates(*this, cr.value(), {{{"math", 0}}, {{"math", 1}}, {{"math", 1}, {"online", 1}}}, 200, timed);
      ASSERT_FALSE(HasFatalFailure());
      for (const gpu_run::Timed& tm : timed)
        std::printf("%-14s %-4s %-60s %8.4f ms  %6.0f GB/s\n", op_info(op).name, dtype_name(dt), tm.id.c_str(),
                    tm.median_ms, 2 * 96 * 1024 * 1024.0 * 2 / (tm.median_ms * 1e6));
    }
}

}  // namespace
}  // namespace kc::evolve
