// Pooling forward and backward in the CUDA template GPU tests (templates_cuda_pool*.cpp): the
// measured shapes, odd small shapes in every kernel and output layout (runtime, baked, strips,
// register spans, vector loads, staged and vector stores), adaptive and global averages, and the
// backward gathers, channels-last included. Skips without a device; the cases of at most 16,384
// elements also run in the host emulation (Emulated).
#include <gtest/gtest.h>

#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/proposer.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve {
namespace {

using nlohmann::json;
using gpu_run::Case;
using gpu_run::Emulated;
using gpu_run::Gpu;
using gpu_run::run_all;

std::vector<Case> pool_cases() {
  std::vector<Case> cs;
  const json m3 = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 3}};
  const json a3 = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}};
  const json a2 = {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}};
  const json m2 = {{"kernel_size", 2}, {"stride", 2}};
  // The measured shapes, f32 and bf16.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    cs.push_back({OpId::kMaxPool3d, {16, 32, 64, 64, 64}, dt, m3, 1, {{{"bake", 0}}, {{"vpt", 4}, {"regs", 1}}}});
    cs.push_back({OpId::kAvgPool3d, {16, 32, 64, 64, 64}, dt, a3, 1, {{{"vpt", 4}, {"il", 0}}}});
    cs.push_back({OpId::kAvgPool2d, {16, 64, 256, 256}, dt, a2, 1,
                  {{{"vpt", 8}, {"regs", 1}}, {{"rows", 4}, {"vpt", 2}}, {{"rows", 4}, {"vpt", 4}, {"regs", 1}, {"stage", 1}}}});
    cs.push_back({OpId::kMaxPool2d, {16, 64, 256, 256}, dt, m2, 1});
    cs.push_back({OpId::kMaxPool2d, {8, 64, 112, 112}, dt, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}, 1,
                  {{{"rows", 4}}, {{"rows", 4}, {"vpt", 4}, {"il", 0}}}});
    cs.push_back({OpId::kMaxPool2dValues, {16, 32, 128, 128}, dt, {{"kernel_size", 4}, {"stride", 1}, {"padding", 1}}, 1,
                  {{{"rows", 4}}}});
  }
  // Odd small shapes: unbatched, ceil mode, dilation, count_include_pad off, divisor_override;
  // each with the runtime kernel and the baked one's output layouts (interleaved, consecutive,
  // register span) at partial last rows.
  // Where windows share input rows along H, strips of 2 and 4 output rows in each layout (partial
  // last strips; a call whose space lacks them renders without).
  const std::vector<Knobs> layouts = {{{"bake", 0}, {"vpt", 2}}, {{"vpt", 2}, {"il", 0}}, {{"vpt", 2}, {"regs", 1}},
                                      {{"rows", 2}, {"vpt", 2}}, {{"rows", 2}, {"vpt", 2}, {"regs", 1}},
                                      {{"rows", 4}, {"vpt", 4}, {"il", 0}}};
  cs.push_back({OpId::kMaxPool2d, {3, 7, 9}, DType::kF32, {{"kernel_size", {3, 2}}, {"padding", 1}, {"ceil_mode", true}}, 6,
                {{{"vpt", 4}, {"gs", 1}}, {{"bake", 0}, {"vpt", 4}, {"gs", 1}}, {{"vpt", 4}, {"il", 0}}}});
  cs.push_back({OpId::kMaxPool2d, {2, 2, 11, 13}, DType::kF16,
                {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}, {"ceil_mode", true}}, 4, layouts});
  cs.push_back({OpId::kMaxPool3d, {2, 2, 7, 9, 10}, DType::kBF16, m3, 4, layouts});
  // Register spans read in vectors (vl), aligned or not (padding 1 starts them 1 early), with and
  // without strips, at partial last vectors and rows: rows of 16, 12 and 24 columns.
  const std::vector<Knobs> vectors = {{{"regs", 1}, {"vpt", 4}, {"vl", 8}}, {{"regs", 1}, {"vpt", 2}, {"vl", 4}},
                                      {{"regs", 1}, {"vpt", 4}, {"vl", 8}, {"rows", 4}}, {{"regs", 1}, {"vpt", 4}, {"vl", 2}, {"gs", 1}}};
  cs.push_back({OpId::kMaxPool3dValues, {2, 3, 6, 10, 16}, DType::kBF16, m2, 2, vectors});
  cs.push_back({OpId::kMaxPool2d, {2, 3, 11, 16}, DType::kBF16, a3, 2, vectors});
  const std::vector<Knobs> vectors_s1 = {{{"regs", 1}, {"vpt", 8}, {"vl", 8}}, {{"regs", 1}, {"vpt", 4}, {"vl", 4}, {"rows", 4}},
                                         {{"regs", 1}, {"vpt", 2}, {"vl", 2}, {"rows", 2}}};
  cs.push_back({OpId::kAvgPool2d, {2, 3, 9, 16}, DType::kF16, a2, 2, vectors_s1});
  cs.push_back({OpId::kMaxPool2dValues, {2, 3, 10, 24}, DType::kBF16, {{"kernel_size", 4}, {"stride", 1}, {"padding", 1}}, 2,
                vectors_s1});
  cs.push_back({OpId::kAvgPool2d, {2, 3, 9, 12}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                                {"count_include_pad", false}}, 2,
                {{{"regs", 1}, {"vpt", 2}, {"vl", 4}}, {{"regs", 1}, {"vpt", 4}, {"vl", 4}, {"rows", 4}}}});
  // The values alone: the same kernels without the index output.
  cs.push_back({OpId::kMaxPool2dValues, {2, 2, 11, 13}, DType::kF16,
                {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}, {"dilation", 2}, {"ceil_mode", true}}, 4, layouts});
  cs.push_back({OpId::kMaxPool3dValues, {2, 3, 6, 9, 10}, DType::kF32, {{"kernel_size", 2}, {"stride", 1}}, 3, layouts});
  cs.push_back({OpId::kAvgPool2d, {2, 3, 9, 10}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                               {"count_include_pad", false}}, 4,
                {{{"vpt", 4}, {"regs", 1}}, {{"vpt", 4}}, {{"vpt", 4}, {"il", 0}}, {{"bake", 0}}, {{"rows", 4}, {"vpt", 4}},
                 {{"rows", 4}, {"regs", 1}, {"vpt", 2}}}});
  cs.push_back({OpId::kAvgPool2d, {1, 2, 8, 8}, DType::kBF16, {{"kernel_size", 2}, {"divisor_override", 3}}, 2,
                {{{"vpt", 4}}, {{"bake", 0}}}});
  cs.push_back({OpId::kAvgPool3d, {2, 5, 6, 7}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                              {"ceil_mode", true}, {"count_include_pad", false}}, 4,
                {{{"vpt", 4}, {"regs", 1}}, {{"vpt", 4}}, {{"bake", 0}, {"vpt", 4}}, {{"rows", 4}, {"vpt", 2}},
                 {{"rows", 4}, {"regs", 1}, {"vpt", 4}}}});
  // Staged stores (kc_stage: a warp's consecutive outputs through shared memory) and vector stores
  // (vst: where a lane's outputs start aligned), with and without indices, in strips, with grid
  // stride and small blocks; the shapes leave partial output rows, partial strips, a partial last
  // warp, and rows of 13 and 77 columns (vectors start aligned on some lanes only) besides 16.
  const std::vector<Knobs> staged = {{{"vpt", 2}, {"il", 0}, {"stage", 1}},
                                     {{"vpt", 4}, {"regs", 1}, {"stage", 1}},
                                     {{"vpt", 8}, {"regs", 1}, {"stage", 1}, {"gs", 1}, {"threads", 64}},
                                     {{"rows", 4}, {"vpt", 4}, {"il", 0}, {"stage", 1}},
                                     {{"rows", 2}, {"vpt", 2}, {"regs", 1}, {"stage", 1}, {"gs", 1}},
                                     {{"vpt", 4}, {"regs", 1}, {"vst", 1}},
                                     {{"vpt", 8}, {"il", 0}, {"vst", 1}, {"gs", 1}, {"threads", 64}},
                                     {{"rows", 4}, {"vpt", 4}, {"regs", 1}, {"vst", 1}}};
  cs.push_back({OpId::kMaxPool2d, {2, 3, 11, 13}, DType::kF32, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}, {"dilation", 2}}, 2,
                staged});
  cs.push_back({OpId::kMaxPool2dValues, {3, 5, 1, 77}, DType::kBF16,
                {{"kernel_size", {1, 8}}, {"stride", {1, 1}}, {"padding", {0, 4}}, {"dilation", {1, 3}}}, 2, staged});
  cs.push_back({OpId::kAvgPool2d, {2, 3, 9, 16}, DType::kF16, a2, 2, staged});
  cs.push_back({OpId::kAvgPool3d, {2, 2, 5, 7, 9}, DType::kBF16, a3, 2, staged});
  // Adaptive: non-divisible and upsampling sizes (the window kernel), the global average (the row
  // kernel, cuda.pool_global) at ResNet-50's head and an odd plane.
  cs.push_back({OpId::kAdaptiveAvgPool2d, {2, 3, 10, 7}, DType::kF32, {{"output_size", {3, 4}}}, 4});
  cs.push_back({OpId::kAdaptiveAvgPool2d, {3, 5, 3}, DType::kBF16, {{"output_size", {7, 5}}}, 2});
  cs.push_back({OpId::kAdaptiveAvgPool3d, {2, 2, 5, 9, 6}, DType::kF16, {{"output_size", {2, 4, 3}}}, 2});
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    cs.push_back({OpId::kAdaptiveAvgPool2d, {32, 2048, 7, 7}, dt, {{"output_size", 1}}, 2,
                  {{{"threads", 32}, {"rows", 8}}, {{"threads", 64}}}});
  cs.push_back({OpId::kAdaptiveAvgPool2d, {2, 3, 33, 40}, DType::kF32, {{"output_size", 1}}, 4, {{{"threads", 1024}}}});
  // Short planes in groups of 4 to 16 lanes; 33 planes leave the last warp's groups mostly dead.
  cs.push_back({OpId::kAdaptiveAvgPool2d, {2, 64, 7, 7}, DType::kF32, {{"output_size", 1}}, 2, {{{"threads", 16}, {"rows", 1}}}});
  cs.push_back({OpId::kAdaptiveAvgPool2d, {3, 11, 5, 5}, DType::kBF16, {{"output_size", 1}}, 2, {{{"threads", 4}}, {{"threads", 8}, {"rows", 2}}}});
  cs.push_back({OpId::kAdaptiveAvgPool3d, {2, 4, 8, 16, 16}, DType::kBF16, {{"output_size", 1}}, 3});
  return cs;
}

TEST_F(Gpu, Pool) { run_all(*this, pool_cases(), 2e-5); }
TEST_F(Emulated, Pool) { EXPECT_GE(run_all(*this, pool_cases(), 2e-5), 51); }

// Pooling backward (a gather): the stem max pool (k3 s2 p1, overlapping), k2 s2, dilation, ceil
// mode, count_include_pad off, divisor_override, adaptive; each dtype.
std::vector<Case> pool_backward_cases() {
  std::vector<Case> cs;
  const json stem = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    cs.push_back({OpId::kMaxPool2dBackward, {8, 64, 112, 112}, dt, stem, 2, {{{"vpt", 4}, {"vst", 1}}}});
    cs.push_back({OpId::kAvgPool2dBackward, {4, 32, 64, 64}, dt, stem, 2});
    cs.push_back({OpId::kAdaptiveAvgPool2dBackward, {4, 32, 7, 7}, dt, {{"output_size", 1}}, 2});
  }
  cs.push_back({OpId::kMaxPool2dBackward, {3, 7, 9}, DType::kF32, {{"kernel_size", {3, 2}}, {"stride", 1}, {"padding", 1}}, 6,
                {{{"vpt", 4}, {"gs", 1}}}});
  cs.push_back({OpId::kMaxPool2dBackward, {2, 2, 11, 13}, DType::kF16,
                {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}, {"ceil_mode", true}}, 4});
  cs.push_back({OpId::kMaxPool3dBackward, {2, 2, 7, 9, 10}, DType::kBF16,
                {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}}, 4});
  cs.push_back({OpId::kMaxPool3dBackward, {4, 16, 32, 32, 32}, DType::kF32, stem, 2});
  cs.push_back({OpId::kAvgPool2dBackward, {2, 3, 9, 10}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                                       {"count_include_pad", false}}, 4});
  cs.push_back({OpId::kAvgPool2dBackward, {1, 2, 8, 8}, DType::kBF16, {{"kernel_size", 2}, {"divisor_override", 3}}, 2});
  cs.push_back({OpId::kAvgPool3dBackward, {2, 5, 6, 7}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                                      {"ceil_mode", true}, {"count_include_pad", false}}, 4});
  cs.push_back({OpId::kAvgPool3dBackward, {4, 16, 32, 32, 32}, DType::kBF16, {{"kernel_size", 2}}, 2});
  cs.push_back({OpId::kAdaptiveAvgPool2dBackward, {2, 3, 10, 7}, DType::kF32, {{"output_size", {3, 4}}}, 4});
  cs.push_back({OpId::kAdaptiveAvgPool3dBackward, {2, 2, 5, 9, 6}, DType::kF16, {{"output_size", {2, 4, 3}}}, 2});
  // Channels-last calls (the channel-vector mapping), overlapping windows.
  const json cl = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"channels_last", true}};
  cs.push_back({OpId::kMaxPool2dBackward, {8, 64, 56, 56}, DType::kBF16, cl, 3, {{{"vpt", 1}}}});
  cs.push_back({OpId::kMaxPool2dBackward, {2, 6, 11, 13}, DType::kF32, cl, 3});
  cs.push_back({OpId::kAvgPool2dBackward, {2, 6, 9, 10}, DType::kF16, cl, 3});
  cs.push_back({OpId::kAdaptiveAvgPool2dBackward, {2, 8, 10, 7}, DType::kF32, {{"output_size", {3, 4}}, {"channels_last", true}}, 3});
  cs.push_back({OpId::kMaxPool3dBackward, {2, 8, 7, 9, 10}, DType::kF32, cl, 3});
  return cs;
}

TEST_F(Gpu, PoolBackward) { run_all(*this, pool_backward_cases(), 2e-5); }
TEST_F(Emulated, PoolBackward) { EXPECT_GE(run_all(*this, pool_backward_cases(), 2e-5), 12); }

}  // namespace
}  // namespace kc::evolve
