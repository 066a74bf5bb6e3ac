// Calls (evolve/ops/op_call.h): every op's call survives key -> call -> key and JSON round trips,
// outputs are inferred as eager lays them out, and malformed keys are statuses.
#include <gtest/gtest.h>

#include "evolve/ops/op_call.h"
#include "evolve/ops/reduction.h"
#include "tests/unit/plain_calls.h"

namespace kc::evolve {
namespace {

TEST(OpCall, KeyRoundTripForEveryOp) {
  for (const auto& info : all_ops()) {
    const PlainCall p = plain_call(info, 5, 7);
    auto c = make_call(info.id, p.sizes, DType::kF32, BackendKind::kCpu, p.args);
    ASSERT_TRUE(c.is_ok()) << info.name << ": " << c.status().to_string();
    c.value().target = "cpu-x86_64-v3+gcc-12.2.0";
    const std::string key = call_key(c.value());
    auto back = call_from_key(key);
    ASSERT_TRUE(back.is_ok()) << key << ": " << back.status().to_string();
    EXPECT_EQ(call_key(back.value()), key);
    EXPECT_EQ(back.value().op, info.id);
    EXPECT_EQ(back.value().outputs.size(), c.value().outputs.size());
    auto j = call_from_json(to_json(back.value()));
    ASSERT_TRUE(j.is_ok());
    EXPECT_EQ(call_key(j.value()), key);
  }
}

// The reduction geometry: one block of reduced dims as [outer, r, inner] (size-1 dims ignored),
// two blocks around the kept ones as [r1, mid, r2], anything else neither.
TEST(OpCall, ReductionGeometryRuns) {
  auto geom = [](std::vector<int64_t> sizes, std::vector<int64_t> dims) {
    auto c = make_call(OpId::kVarMean, sizes, DType::kF32, BackendKind::kCuda, {{"dim", dims}});
    EXPECT_TRUE(c.is_ok());
    return reduce_geometry(c.value()).value();
  };
  ReduceGeom g = geom({32, 256, 56, 56}, {0, 2, 3});
  EXPECT_FALSE(g.block);
  EXPECT_TRUE(g.two_runs);
  EXPECT_EQ(std::vector<int64_t>({g.r1, g.mid, g.r2, g.r}), std::vector<int64_t>({32, 256, 3136, 32 * 3136}));
  g = geom({4, 6, 8, 3}, {0, 3});
  EXPECT_TRUE(g.two_runs && g.r1 == 4 && g.mid == 48 && g.r2 == 3);
  g = geom({8, 1, 5, 7}, {0, 2});   // the size-1 dim between: one block
  EXPECT_TRUE(g.block && !g.two_runs && g.outer == 1 && g.r == 40 && g.inner == 7);
  EXPECT_FALSE(geom({2, 3, 4, 5}, {1, 3}).two_runs);   // kept, reduced, kept, reduced
  EXPECT_FALSE(geom({4, 6, 8, 3}, {0, 2}).two_runs);   // a kept dim after the second run
  EXPECT_FALSE(geom({4, 6, 8, 3}, {1, 2}).two_runs);   // one block
}

TEST(OpCall, LayerNormOutputsAndMasks) {
  auto c = make_call(OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32, BackendKind::kCuda, {{"normalized_shape", {64, 256, 256}}});
  ASSERT_TRUE(c.is_ok());
  ASSERT_EQ(c.value().outputs.size(), 3u);
  EXPECT_EQ(c.value().outputs[1].sizes, (std::vector<int64_t>{1, 1, 1, 1}));
  auto b = make_call(OpId::kLayerNormBackward, {8, 512}, DType::kF32, BackendKind::kCuda, {{"output_mask", {1, 0, 1}}});
  ASSERT_TRUE(b.is_ok());
  EXPECT_TRUE(b.value().outputs[0].defined);
  EXPECT_FALSE(b.value().outputs[1].defined);
  EXPECT_TRUE(b.value().outputs[2].defined);
  EXPECT_TRUE(b.value().dense());
}

// ATen's contract for reduced precision: CUDA saves fp32 statistics (its accumulate type) and
// refuses parameters of another dtype than the input's; the CPU saves them in the input's dtype,
// or fp32 when a bf16 / f16 input has fp32 parameters (mixed). grads follow their parameters.
TEST(OpCall, LayerNormStatisticsByBackend) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    auto cu = make_call(OpId::kLayerNorm, {4, 7}, dt, BackendKind::kCuda);
    ASSERT_TRUE(cu.is_ok());
    EXPECT_EQ(cu->outputs[0].dtype, dt);
    EXPECT_EQ(cu->outputs[1].dtype, DType::kF32);
    EXPECT_EQ(cu->outputs[2].dtype, DType::kF32);
    auto cub = make_call(OpId::kLayerNormBackward, {4, 7}, dt, BackendKind::kCuda);
    ASSERT_TRUE(cub.is_ok());
    EXPECT_EQ(cub->input("mean")->dtype, DType::kF32);
    EXPECT_EQ(cub->outputs[1].dtype, dt);
    EXPECT_FALSE(make_call(OpId::kLayerNorm, {4, 7}, dt, BackendKind::kCuda, {{"param_dtype", "f32"}}).is_ok());
    auto cpu = make_call(OpId::kLayerNorm, {4, 7}, dt, BackendKind::kCpu);
    ASSERT_TRUE(cpu.is_ok());
    EXPECT_EQ(cpu->outputs[1].dtype, dt);
    auto mixed = make_call(OpId::kLayerNormBackward, {4, 7}, dt, BackendKind::kCpu, {{"param_dtype", "f32"}});
    ASSERT_TRUE(mixed.is_ok());
    EXPECT_EQ(mixed->input("rstd")->dtype, DType::kF32);
    EXPECT_EQ(mixed->outputs[0].dtype, dt);
    EXPECT_EQ(mixed->outputs[1].dtype, DType::kF32);
    EXPECT_EQ(mixed->outputs[2].dtype, DType::kF32);
    auto plain = make_call(OpId::kLayerNorm, {4, 7}, dt, BackendKind::kCpu, {{"affine", false}});
    ASSERT_TRUE(plain.is_ok());
    EXPECT_EQ(plain->outputs[2].dtype, dt);
  }
}

TEST(OpCall, BadKeysAreStatuses) {
  for (const std::string k : {"", "kc1|x", "kc9|t|aten::relu|fp32|self=T:f32[2]s[1]a16",
                              "kc1|t|aten::nope|fp32|self=T:f32[2]s[1]a16", "kc1|t|aten::relu|fp32|self=T:f32[2s[1]a16",
                              "kc1|t|aten::relu|fp32|self=T:q9[2]s[1]a16",
                              // a target of no backend this build knows: an error, never read as the CPU
                              "kc1|hip-gfx942|aten::relu|fp32|self=T:f32[2]s[1]a16"})
    EXPECT_FALSE(call_from_key(k).is_ok()) << k;
}

TEST(OpCall, NormalizedShapeMustBeTrailing) {
  EXPECT_FALSE(make_call(OpId::kLayerNorm, {4, 8}, DType::kF32, BackendKind::kCpu, {{"normalized_shape", {4}}}).is_ok());
}

}  // namespace
}  // namespace kc::evolve
