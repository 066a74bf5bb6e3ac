// Cases of the CUDA template tests; see template_cuda_cases.h.
#include "tests/unit/template_cuda_cases.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kc::evolve::cuda_cases {

std::string describe(const Case& k) {
  std::string s = op_info(k.op).name;
  s += "[";
  for (size_t i = 0; i < k.sizes.size(); ++i) s += (i ? "," : "") + std::to_string(k.sizes[i]);
  return s + "]" + dtype_name(k.dt) + (k.args.empty() ? "" : k.args.dump());
}

// One main shape per op, dtype and arguments with 6 random settings (3 for halves), odd shapes
// with 2: sources are mostly shape-free, so the odd shapes mostly share the main shape's compiles
// and the test stays within about a minute of NVRTC on two cores.
std::vector<Case> cases() {
  std::vector<Case> v;
  const json none = json::object();
  using Sizes = std::vector<std::vector<int64_t>>;
  for (OpId op : {OpId::kRelu, OpId::kSilu, OpId::kSigmoid, OpId::kTanh, OpId::kGelu}) {
    v.push_back({op, {1000, 37}, DType::kF32, none, 6});
    for (auto s : Sizes{{1}, {7, 13, 5}}) v.push_back({op, s, DType::kF32, none});
  }
  v.push_back({OpId::kGelu, {4099}, DType::kF32, {{"approximate", "tanh"}}, 6});
  v.push_back({OpId::kGelu, {64, 33}, DType::kF16, {{"approximate", "tanh"}}, 3});
  v.push_back({OpId::kRelu, {3, 5}, DType::kBF16, none, 3});
  v.push_back({OpId::kSilu, {1025}, DType::kF16, none, 3});
  for (OpId op : {OpId::kLeakyRelu, OpId::kElu, OpId::kHardtanh, OpId::kHardsigmoid, OpId::kHardswish, OpId::kSoftplus,
                  OpId::kMish, OpId::kLeakyReluBackward, OpId::kEluBackward, OpId::kHardtanhBackward,
                  OpId::kHardsigmoidBackward, OpId::kHardswishBackward, OpId::kSoftplusBackward, OpId::kMishBackward})
    v.push_back({op, {257, 3}, op == OpId::kMish ? DType::kBF16 : DType::kF32, none, 2});
  // Fast math (16-bit data): every op that has it, in both halves.
  for (OpId op : {OpId::kSilu, OpId::kSigmoid, OpId::kTanh, OpId::kElu, OpId::kSoftplus, OpId::kMish, OpId::kSiluBackward,
                  OpId::kEluBackward, OpId::kSoftplusBackward, OpId::kMishBackward})
    for (DType dt : {DType::kBF16, DType::kF16}) v.push_back({op, {513}, dt, none, 0, {{{"math", 1}}}});
  for (OpId op : {OpId::kGelu, OpId::kGeluBackward})
    v.push_back({op, {513}, DType::kBF16, {{"approximate", "tanh"}}, 0, {{{"math", 1}}}});
  v.push_back({OpId::kGelu, {513}, DType::kF16, json::object(), 0, {{{"math", 1}}}});
  for (OpId op : {OpId::kReluBackward, OpId::kSiluBackward, OpId::kSigmoidBackward, OpId::kTanhBackward,
                  OpId::kGeluBackward}) {
    v.push_back({op, {513, 7}, DType::kF32, none, 6});
    v.push_back({op, {3}, DType::kF32, none});
  }
  v.push_back({OpId::kReluBackward, {100}, DType::kF32, {{"threshold", 0.25}}});
  v.push_back({OpId::kReluBackward, {10, 10}, DType::kBF16, {{"threshold", 1}}, 3});
  v.push_back({OpId::kGeluBackward, {77}, DType::kF32, {{"approximate", "tanh"}}, 6});
  v.push_back({OpId::kTanhBackward, {9, 9}, DType::kF16, none, 3});
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax, OpId::kSoftmaxBackward, OpId::kLogSoftmaxBackward}) {
    v.push_back({op, {33, 1000}, DType::kF32, none, 6});
    for (auto s : Sizes{{1, 1}, {5, 7}, {4, 4096}, {2, 3, 40000}}) v.push_back({op, s, DType::kF32, none});
    v.push_back({op, {6, 130}, DType::kF32, {{"dim", 1}}});
    v.push_back({op, {64, 128}, DType::kF16, none, 3});
    v.push_back({op, {3, 200}, DType::kBF16, none, 3});
  }
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax})   // fast math, online and held in registers
    v.push_back({op, {65, 1000}, DType::kF16, none, 0, {{{"math", 1}, {"online", 1}}, {{"math", 1}, {"online", 0}, {"regs", 1}}}});
  for (const json& a : {json{{"normalized_shape", {5}}}, json{{"normalized_shape", {5}}, {"affine", false}},
                        json{{"normalized_shape", {5}}, {"bias", false}}})
    v.push_back({OpId::kLayerNorm, {3, 5}, DType::kF32, a});
  v.push_back({OpId::kLayerNorm, {37, 130}, DType::kF32, {{"normalized_shape", {130}}}});
  v.push_back({OpId::kLayerNorm, {4096, 1024}, DType::kF32, {{"normalized_shape", {1024}}}, 6});
  v.push_back({OpId::kLayerNorm, {2, 3, 4096}, DType::kF32, {{"normalized_shape", {3, 4096}}, {"affine", false}}});
  v.push_back({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32, {{"normalized_shape", {64, 256, 256}}}, 6});
  for (const json& mask : {json{1, 1, 1}, json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}, json{0, 1, 0}}) {
    v.push_back({OpId::kLayerNormBackward, {3, 5}, DType::kF32, {{"normalized_shape", {5}}, {"output_mask", mask}}});
    v.push_back({OpId::kLayerNormBackward, {1, 64, 256, 256}, DType::kF32,
                 {{"normalized_shape", {64, 256, 256}}, {"output_mask", mask}}});
  }
  // Layer norm in halves: 8-wide vectors (16 bytes), N not a multiple of 8, odd N, the split row,
  // with and without weight and bias; the backward's column sums with 8-wide halves.
  v.push_back({OpId::kLayerNorm, {4096, 1024}, DType::kBF16, {{"normalized_shape", {1024}}}, 3});
  v.push_back({OpId::kLayerNorm, {37, 130}, DType::kF16, {{"normalized_shape", {130}}}, 3});
  v.push_back({OpId::kLayerNorm, {3, 5}, DType::kBF16, {{"normalized_shape", {5}}, {"affine", false}}, 2});
  v.push_back({OpId::kLayerNorm, {3, 5}, DType::kF16, {{"normalized_shape", {5}}, {"bias", false}}, 2});
  v.push_back({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kBF16, {{"normalized_shape", {64, 256, 256}}}, 3});
  v.push_back({OpId::kLayerNormBackward, {4096, 1024}, DType::kBF16, {{"normalized_shape", {1024}}}, 3});
  v.push_back({OpId::kLayerNormBackward, {33, 131}, DType::kF16, {{"normalized_shape", {131}}}, 3});
  for (const json& mask : {json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}})
    v.push_back({OpId::kLayerNormBackward, {3, 5}, DType::kBF16, {{"normalized_shape", {5}}, {"output_mask", mask}}, 2});
  v.push_back({OpId::kLayerNormBackward, {1, 64, 256, 256}, DType::kF16, {{"normalized_shape", {64, 256, 256}}}, 3});
  // Group norm: the split shape, U-Net shapes, odd ones; bf16/f16 with their own and fp32 params.
  // The fused launch (a cluster of 8 blocks a 2 MB row; one block a 160 KB row) at its seeds.
  v.push_back({OpId::kGroupNorm, {16, 64, 256, 256}, DType::kF32, {{"group", 8}}, 6,
               {{{"fuse", 8}, {"threads", 1024}, {"resident", 1}}, {{"fuse", 4}, {"threads", 256}}}});
  v.push_back({OpId::kGroupNorm, {8, 320, 64, 64}, DType::kF32, {{"group", 32}}, 6,
               {{{"fuse", 1}, {"threads", 512}, {"resident", 2}}, {{"fuse", 2}, {"threads", 1024}, {"resident", 1}},
                {{"fuse", 4}, {"threads", 1024}, {"regs", 1}}}});
  v.push_back({OpId::kGroupNorm, {8, 1280, 16, 16}, DType::kBF16, {{"group", 32}, {"param_dtype", "f32"}}, 3});
  v.push_back({OpId::kGroupNorm, {32, 64, 56, 56}, DType::kBF16, {{"group", 32}}, 3, {{{"fuse", 1}, {"threads", 128}}}});
  v.push_back({OpId::kGroupNorm, {2, 6, 5}, DType::kF16, {{"group", 3}, {"affine", false}}, 3});
  v.push_back({OpId::kGroupNorm, {3, 8, 7, 9}, DType::kF32, {{"group", 4}}});
  // Batch norm: instance norm as (1, N*C, H, W) training without running stats, bf16 eval with
  // fp32 parameters, odd shapes.
  const json bn_train = {{"training", true}, {"running", false}, {"affine", false}};
  v.push_back({OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kF32, bn_train, 6,
               {{{"fuse", 4}, {"threads", 1024}, {"regs", 1}}, {{"fuse", 4}, {"threads", 512}, {"regs", 1}}}});
  v.push_back({OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kBF16, bn_train, 1, {{{"fuse", 4}, {"threads", 1024}, {"regs", 1}}}});
  v.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", true}, {"running", false}}, 3});
  v.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", false}, {"param_dtype", "f32"}}, 3});
  v.push_back({OpId::kBatchNorm, {3, 5, 7}, DType::kF16, {{"training", false}, {"affine", false}}});
  v.push_back({OpId::kBatchNorm, {2, 4, 3, 3}, DType::kF32, {{"training", true}, {"running", false}}});
  // Batch norm backward: the measured (16, 64, 256, 256) training shape per dtype, bf16 with fp32
  // parameters, eval, masks without grad_input or with it alone, odd shapes.
  v.push_back({OpId::kBatchNormBackward, {16, 64, 256, 256}, DType::kF32, {{"train", true}}, 6});
  v.push_back({OpId::kBatchNormBackward, {16, 64, 256, 256}, DType::kBF16, {{"train", true}}, 3});
  v.push_back({OpId::kBatchNormBackward, {16, 64, 256, 256}, DType::kBF16, {{"train", false}, {"param_dtype", "f32"}}, 3});
  v.push_back({OpId::kBatchNormBackward, {3, 5, 7}, DType::kF16, {{"train", true}, {"affine", false}}});
  v.push_back({OpId::kBatchNormBackward, {2, 4, 3, 3}, DType::kF32, {{"train", true}, {"output_mask", {0, 1, 1}}}});
  v.push_back({OpId::kBatchNormBackward, {2, 4, 3, 3}, DType::kF16, {{"train", false}, {"output_mask", {1, 0, 0}}}});
  // Group norm backward: the measured (16, 64, 256, 256) shape with 8 groups per dtype (several
  // blocks per plane), U-Net shapes, no weight, masks without grad_input or with it alone, HxW = 1.
  v.push_back({OpId::kGroupNormBackward, {16, 64, 256, 256}, DType::kF32, {{"group", 8}}, 6});
  v.push_back({OpId::kGroupNormBackward, {16, 64, 256, 256}, DType::kBF16, {{"group", 8}}, 3});
  v.push_back({OpId::kGroupNormBackward, {8, 320, 64, 64}, DType::kF16, {{"group", 32}}, 3});
  v.push_back({OpId::kGroupNormBackward, {8, 1280, 16, 16}, DType::kBF16, {{"group", 32}, {"param_dtype", "f32"}}, 2});
  v.push_back({OpId::kGroupNormBackward, {3, 6, 7}, DType::kF16, {{"group", 3}, {"affine", false}}});
  v.push_back({OpId::kGroupNormBackward, {2, 4, 3, 3}, DType::kF32, {{"group", 2}, {"output_mask", {0, 1, 1}}}});
  v.push_back({OpId::kGroupNormBackward, {2, 4, 3, 3}, DType::kBF16, {{"group", 4}, {"output_mask", {1, 0, 0}}}});
  v.push_back({OpId::kGroupNormBackward, {4, 6}, DType::kF32, {{"group", 3}}});
  // Embedding backward: GPT-2's vocabulary (two radix passes) per dtype, int32 indices, a table of
  // 300000 rows (three passes), padding and scale_grad_by_freq, an odd D (vec 1).
  v.push_back({OpId::kEmbeddingBackward, {8192, 768}, DType::kF32, {{"num_weights", 50257}}, 4, {{{"atomic", 1}}, {{"atomic", 2}}}});
  v.push_back({OpId::kEmbeddingBackward, {3, 700, 67}, DType::kF32, {{"num_weights", 1000}, {"index_dtype", "i32"}}, 0,
               {{{"atomic", 1}}}});
  v.push_back({OpId::kEmbeddingBackward, {4, 2048, 1024}, DType::kBF16, {{"num_weights", 50257}, {"padding_idx", 0}}, 2});
  v.push_back({OpId::kEmbeddingBackward, {8192, 768}, DType::kF16, {{"num_weights", 50257}, {"index_dtype", "i32"}}, 2});
  v.push_back({OpId::kEmbeddingBackward, {3, 11, 7}, DType::kF32, {{"num_weights", 300000}, {"padding_idx", 5}, {"scale_grad_by_freq", true}}});
  // Pooling: the measured shapes, each dtype, unbatched, ceil mode, dilation, divisor_override;
  // extras: every kernel (runtime, baked with interleaved, consecutive or register-span outputs,
  // strips of output rows) at every output count is compiled on some call, whatever the sample draws.
  const json p3 = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}};
  v.push_back({OpId::kMaxPool3d, {16, 32, 64, 64, 64}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 3}}, 6,
               {{{"bake", 0}}, {{"vpt", 8}, {"il", 0}}, {{"vpt", 4}, {"regs", 1}}, {{"vpt", 1}}}});
  v.push_back({OpId::kAvgPool3d, {16, 32, 64, 64, 64}, DType::kBF16, p3, 3,
               {{{"vpt", 8}, {"regs", 1}}, {{"vpt", 4}, {"il", 0}}, {{"bake", 0}, {"vpt", 8}}}});
  v.push_back({OpId::kAvgPool2d, {16, 64, 256, 256}, DType::kF32, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}, 6,
               {{{"vpt", 8}, {"regs", 1}}, {{"vpt", 2}, {"regs", 1}, {"threads", 1024}}, {{"rows", 4}},
                {{"rows", 2}, {"vpt", 4}, {"regs", 1}}, {{"rows", 4}, {"vpt", 8}, {"il", 0}}}});
  v.push_back({OpId::kMaxPool2d, {32, 64, 112, 112}, DType::kBF16, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}, 2,
               {{{"rows", 4}}, {{"rows", 4}, {"vpt", 4}, {"regs", 1}}}});
  v.push_back({OpId::kMaxPool2dValues, {16, 32, 256, 256}, DType::kF32, {{"kernel_size", 4}, {"stride", 1}, {"padding", 1}}, 2,
               {{{"rows", 4}}, {{"bake", 0}}, {{"vpt", 4}, {"regs", 1}}}});
  v.push_back({OpId::kMaxPool3dValues, {8, 64, 16, 112, 112}, DType::kBF16, {{"kernel_size", 2}, {"stride", 2}}, 2,
               {{{"regs", 1}, {"vpt", 4}, {"vl", 8}}, {{"regs", 1}, {"vpt", 2}, {"vl", 4}}}});
  v.push_back({OpId::kMaxPool2dValues, {2, 3, 11, 16}, DType::kBF16, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}, 0,
               {{{"regs", 1}, {"vpt", 4}, {"vl", 8}, {"rows", 4}}, {{"regs", 1}, {"vpt", 4}, {"vl", 8}, {"rows", 1}}}});
  v.push_back({OpId::kAvgPool2d, {2, 3, 9, 12}, DType::kF32, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}, 0,
               {{{"regs", 1}, {"vpt", 4}, {"vl", 4}, {"rows", 4}}, {{"regs", 1}, {"vpt", 4}, {"vl", 4}, {"rows", 4}, {"stage", 1}}}});
  // Staged (kc_stage) and vector (vst) stores with and without the index output.
  v.push_back({OpId::kMaxPool2d, {2, 3, 11, 16}, DType::kF16, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}, 0,
               {{{"regs", 1}, {"vpt", 4}, {"stage", 1}}, {{"vpt", 8}, {"il", 0}, {"stage", 1}, {"gs", 1}, {"rows", 2}},
                {{"regs", 1}, {"vpt", 8}, {"vst", 1}}, {{"vpt", 4}, {"il", 0}, {"vst", 1}, {"rows", 4}}}});
  v.push_back({OpId::kMaxPool2dValues, {64, 192, 1, 16384}, DType::kBF16,
               {{"kernel_size", {1, 8}}, {"stride", {1, 1}}, {"padding", {0, 4}}, {"dilation", {1, 3}}}, 0,
               {{{"regs", 1}, {"vpt", 8}, {"vl", 4}, {"stage", 1}}}});
  v.push_back({OpId::kMaxPool2d, {16, 64, 256, 256}, DType::kF16, {{"kernel_size", 2}, {"stride", 2}}, 3,
               {{{"il", 0}}, {{"vpt", 8}}}});
  v.push_back({OpId::kMaxPool2d, {3, 7, 9}, DType::kF32, {{"kernel_size", {3, 2}}, {"padding", 1}, {"ceil_mode", true}}, 2,
               {{{"vpt", 4}}, {{"vpt", 4}, {"il", 0}}}});
  v.push_back({OpId::kAvgPool2d, {1, 2, 8, 8}, DType::kBF16, {{"kernel_size", 2}, {"divisor_override", 3}}, 2,
               {{{"vpt", 4}, {"il", 0}}}});
  v.push_back({OpId::kAvgPool3d, {2, 5, 6, 7}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                              {"ceil_mode", true}, {"count_include_pad", false}}, 2,
               {{{"vpt", 2}, {"regs", 1}}, {{"vpt", 4}}}});
  // Adaptive (window and global kernels) and pooling backward: the measured shapes, each dtype.
  v.push_back({OpId::kAdaptiveAvgPool2d, {32, 2048, 7, 7}, DType::kBF16, {{"output_size", 1}}, 3});
  v.push_back({OpId::kAdaptiveAvgPool3d, {4, 64, 16, 32, 32}, DType::kF32, {{"output_size", 1}}, 6});
  v.push_back({OpId::kAdaptiveAvgPool2d, {2, 3, 10, 7}, DType::kF16, {{"output_size", {3, 4}}}, 3});
  v.push_back({OpId::kMaxPool2dBackward, {32, 64, 112, 112}, DType::kF32, p3, 6});
  v.push_back({OpId::kMaxPool3dBackward, {4, 32, 64, 64, 64}, DType::kBF16, p3, 3});
  v.push_back({OpId::kAvgPool2dBackward, {3, 11, 7}, DType::kF16, {{"kernel_size", {3, 2}}, {"stride", 2}, {"padding", {1, 0}},
                                                                   {"ceil_mode", true}, {"count_include_pad", false}}, 3});
  v.push_back({OpId::kAvgPool3dBackward, {4, 32, 64, 64, 64}, DType::kF32, {{"kernel_size", 2}, {"divisor_override", 3}}, 6});
  v.push_back({OpId::kAdaptiveAvgPool2dBackward, {32, 2048, 7, 7}, DType::kBF16, {{"output_size", 1}}, 3});
  v.push_back({OpId::kAdaptiveAvgPool3dBackward, {2, 2, 5, 9, 6}, DType::kF32, {{"output_size", {2, 4, 3}}}, 6});
  // Channels-last backward calls take the channel-vector mapping.
  v.push_back({OpId::kMaxPool2dBackward, {32, 64, 112, 112}, DType::kBF16, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                                            {"channels_last", true}}, 3});
  v.push_back({OpId::kAvgPool2dBackward, {2, 6, 9, 10}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                                      {"count_include_pad", false}, {"channels_last", true}}, 6});
  v.push_back({OpId::kMaxPool3dBackward, {2, 8, 7, 9, 10}, DType::kF16, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                                         {"channels_last", true}}, 3});
  v.push_back({OpId::kLayerNormBackward, {4096, 1024}, DType::kF32, {{"normalized_shape", {1024}}}, 6});
  v.push_back({OpId::kLayerNormBackward, {33, 131}, DType::kF32, {{"normalized_shape", {131}}, {"affine", false},
                                                                   {"output_mask", {1, 0, 0}}}});
  // Scans: rows (inner 1, split by default for few long rows) and strided columns (split along L).
  for (OpId op : {OpId::kCumsum, OpId::kCumprod, OpId::kLogcumsumexp}) {
    v.push_back({op, {33, 1000}, DType::kF32, {{"dim", -1}}, 6});
    v.push_back({op, {128, 262144}, DType::kF32, {{"dim", -1}}, 6});
    v.push_back({op, {32768, 1024}, DType::kF32, {{"dim", 0}}, 6});
    for (auto s : Sizes{{1}, {5, 3, 17}, {9, 1}}) v.push_back({op, s, DType::kF32, {{"dim", 0}}});
    v.push_back({op, {5, 3, 17}, DType::kF32, {{"dim", 1}}});
    v.push_back({op, {64, 130}, DType::kBF16, {{"dim", 1}}, 3});
    v.push_back({op, {4096, 64}, DType::kF16, {{"dim", 0}}, 3});
  }
  v.push_back({OpId::kCumsum, {6, 50}, DType::kF32, {{"dim", 1}, {"dtype", "f32"}}});
  // Reductions: rows, columns (odd inner: scalar loads), few outputs (split), all dims, each
  // dtype, an fp32 result of bf16, and every op's fold state.
  for (OpId op : {OpId::kSum, OpId::kMean, OpId::kAmax, OpId::kAmin, OpId::kArgmax, OpId::kArgmin, OpId::kVar, OpId::kStd,
                  OpId::kVarMean, OpId::kStdMean, OpId::kVectorNorm, OpId::kMax, OpId::kMin, OpId::kProd,
                  OpId::kLogsumexp}) {
    v.push_back({op, {128, 4096, 4095}, DType::kF32, {{"dim", 1}}, 4});
    v.push_back({op, {4096, 4095}, DType::kF32, {{"dim", -1}}, 4});
    v.push_back({op, {1 << 20, 16}, DType::kBF16, {{"dim", 0}}, 3});
    v.push_back({op, {5, 3, 17}, DType::kF16, {{"dim", 1}}, 2});
  }
  // Two runs around the kept dims (batch-norm statistics), every kind that takes a dim list.
  for (OpId op : {OpId::kSum, OpId::kMean, OpId::kAmax, OpId::kVarMean, OpId::kStd, OpId::kVectorNorm, OpId::kLogsumexp}) {
    v.push_back({op, {32, 256, 56, 56}, DType::kF32, {{"dim", {0, 2, 3}}}, 3});
    v.push_back({op, {8, 64, 49}, DType::kBF16, {{"dim", {0, 2}}, {"keepdim", true}}, 2});
  }
  v.push_back({OpId::kSum, {64, 1 << 20}, DType::kF32, {{"dim", "none"}}, 4});
  v.push_back({OpId::kMean, {8, 4096, 64}, DType::kBF16, {{"dim", {1, 2}}, {"dtype", "f32"}}, 3});
  v.push_back({OpId::kVectorNorm, {256, 1000}, DType::kF32, {{"dim", "none"}, {"ord", INFINITY}}, 3});
  v.push_back({OpId::kVectorNorm, {256, 1000}, DType::kBF16, {{"dim", 1}, {"ord", 3}}, 3});
  v.push_back({OpId::kArgmax, {16, 1024}, DType::kF32, {{"dim", "none"}}, 3});
  v.push_back({OpId::kProd, {64, 4096}, DType::kBF16, {{"dim", 1}, {"dtype", "f32"}}, 3});
  // Wide columns at 16-byte (argmax, max.dim) and 12-byte (var) states: the default rows fit the merge.
  v.push_back({OpId::kMax, {16, 256, 256}, DType::kBF16, {{"dim", 1}, {"keepdim", true}}, 3});
  v.push_back({OpId::kArgmax, {16, 256, 256}, DType::kBF16, {{"dim", 1}}, 2});
  v.push_back({OpId::kVar, {16, 256, 256}, DType::kF32, {{"dim", 1}}, 2});
  // Losses: each reduction (none: one map launch; mean / sum: fused partials and a final launch,
  // or one block), weights, ignore_index, 1d nll and nll2d, halves, the 64 MiB mean.
  for (int64_t r : {0, 1, 2}) {
    const json red = {{"reduction", r}};
    v.push_back({OpId::kMseLoss, {1000003}, DType::kF32, red, 4});
    v.push_back({OpId::kSmoothL1Loss, {7, 13, 5}, DType::kBF16, {{"reduction", r}, {"beta", 0.5}}});
    v.push_back({OpId::kHuberLoss, {4099}, DType::kF16, {{"reduction", r}, {"delta", 2.0}}});
    v.push_back({OpId::kBinaryCrossEntropy, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}}, 3});
    v.push_back({OpId::kNllLoss, {4096, 1000}, DType::kBF16, {{"reduction", r}, {"weight", true}, {"ignore_index", 3}}, 3});
    v.push_back({OpId::kNllLoss, {7}, DType::kF32, red});
    v.push_back({OpId::kNllLoss2d, {2, 5, 7, 9}, DType::kF16, red});
  }
  v.push_back({OpId::kMseLoss, {1 << 24}, DType::kF32, json::object(), 4});
  // bce with logits: parameters of self's sizes and along the last dim (a class count that takes
  // vectors of 8, and an odd one that takes none), one weight for all, the eager_gaps shape.
  for (int64_t r : {0, 1, 2}) {
    v.push_back({OpId::kBceWithLogits, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}, {"pos_weight", true}}, 3});
    v.push_back({OpId::kBceWithLogits, {4096, 1000}, DType::kBF16, {{"reduction", r}, {"weight", "last"}, {"pos_weight", "last"}}, 3});
    v.push_back({OpId::kBceWithLogits, {513, 7}, DType::kF16, {{"reduction", r}, {"pos_weight", {1, 7}}, {"weight", json::array()}}, 2});
  }
  v.push_back({OpId::kBceWithLogits, {32768, 2048}, DType::kBF16, json::object(), 2});
  // Loss backward: grad_output one value or one per term; smooth_l1 (beta 0: a sign) and huber in
  // halves and fp32; nll's vectors along classes (nll2d: along the plane).
  for (int64_t r : {0, 1, 2}) {
    v.push_back({OpId::kMseLossBackward, {1000003}, DType::kBF16, {{"reduction", r}}, 3});
    v.push_back({OpId::kBinaryCrossEntropyBackward, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}}, 3});
    v.push_back({OpId::kSmoothL1LossBackward, {4099}, DType::kF16, {{"reduction", r}, {"beta", 0.5}}, 3});
    v.push_back({OpId::kSmoothL1LossBackward, {7, 13, 5}, DType::kF32, {{"reduction", r}, {"beta", 0.0}}, 2});
    v.push_back({OpId::kHuberLossBackward, {1000003}, DType::kBF16, {{"reduction", r}, {"delta", 2.0}}, 3});
    v.push_back({OpId::kNllLossBackward, {4096, 1000}, DType::kF16, {{"reduction", r}, {"weight", true}}, 3});
    v.push_back({OpId::kNllLoss2dBackward, {2, 5, 8, 9}, DType::kF32, {{"reduction", r}}});
  }
  v.push_back({OpId::kNllLossBackward, {7}, DType::kF32, json::object()});
  // Cross-entropy: the LLM vocabulary in bf16 (a block a row), a small weighted and smoothed one
  // (a warp a row) at every reduction, upcast's fp32 probabilities and weight, 1-d f16 calls.
  for (OpId op : {OpId::kCrossEntropy, OpId::kCrossEntropyBackward}) {
    v.push_back({op, {8192, 128256}, DType::kBF16, {{"reduction", 1}}, 1});
    for (int64_t r : {0, 1, 2})
      v.push_back({op, {37, 1000}, DType::kF32, {{"reduction", r}, {"weight", true}, {"label_smoothing", 0.1}, {"ignore_index", 3}}, 1});
    v.push_back({op, {9, 130}, DType::kBF16, {{"probs", true}, {"weight", true}, {"upcast", true}}, 1});
    v.push_back({op, {7}, DType::kF16, {{"probs", true}, {"reduction", 2}}, 0});
  }
  // RMSNorm: warp and block rows, weight or none, odd columns, a split long row, every mask.
  for (OpId op : {OpId::kRmsNorm, OpId::kRmsNormBackward}) {
    v.push_back({op, {64, 4096}, DType::kBF16, json::object(), 2});
    v.push_back({op, {37, 1000}, DType::kF32, {{"weight", false}}, 2});
    v.push_back({op, {5, 77}, DType::kF16, json::object(), 1});
    v.push_back({op, {1, 128256}, DType::kBF16, json::object(), 1});
  }
  for (const json& mask : {json{1, 0}, json{0, 1}})
    v.push_back({OpId::kRmsNormBackward, {33, 1024}, DType::kF32, {{"output_mask", mask}}, 1});
  // KL divergence: KernelBench's (32768, 4096) batchmean (a sum) in f32 and bf16, every reduction
  // with log_target both ways, an odd f16 size with a tail.
  for (OpId op : {OpId::kKlDiv, OpId::kKlDivBackward}) {
    v.push_back({op, {32768, 4096}, DType::kF32, {{"reduction", 2}}, 2});
    v.push_back({op, {32768, 4096}, DType::kBF16, {{"reduction", 2}}, 2});
    for (int64_t r : {0, 1})
      for (bool lt : {false, true}) v.push_back({op, {37, 1000}, DType::kF32, {{"reduction", r}, {"log_target", lt}}, 1});
    v.push_back({op, {5, 77}, DType::kF16, {{"reduction", 1}, {"log_target", true}}, 1});
  }
  return v;
}

OpCall call_of(const Case& k) {
  auto c = make_call(k.op, k.sizes, k.dt, BackendKind::kCuda, k.args);
  EXPECT_TRUE(c.is_ok()) << describe(k) << ": " << c.status().to_string();
  return c.is_ok() ? c.value() : OpCall{};
}

const Template* cuda_template_for(const OpCall& c) {
  const Template* found = nullptr;
  for (const Template* t : cuda_templates())
    if (!t->space(c).empty()) {
      EXPECT_EQ(found, nullptr) << "two CUDA templates claim " << op_info(c.op).name;
      found = t;
    }
  return found;
}

}  // namespace kc::evolve::cuda_cases
