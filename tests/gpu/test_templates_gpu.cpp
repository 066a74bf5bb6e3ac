// CUDA op-family templates on a real GPU: a sample of knob settings of every family at several
// shapes (odd sizes, rows not a multiple of 32, channels-last, reduced precision) against fp64
// references, through the runner of template_gpu_run.h. Skips without a device. Every family's
// cases also run on the host (Emulated, template_emu.h) at the shapes of at most 16,384 elements,
// with the settings each case names: the CPU-only CI checks the templates' logic there. The layer norm
// cases are in template_gpu_layer_norm.cpp, pooling's in template_gpu_pool.cpp, the composites and
// backward families in their own template_gpu_*.cpp, the timings in template_gpu_timings.cpp.
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

const json kNone = json::object();

std::vector<Case> unary_cases() {
  std::vector<Case> cs;
  for (OpId op : {OpId::kRelu, OpId::kGelu, OpId::kSilu, OpId::kSigmoid, OpId::kTanh}) {
    cs.push_back({op, {1}, DType::kF32, kNone, 1});
    cs.push_back({op, {7, 13, 5}, DType::kF32, kNone, 4});
    cs.push_back({op, {1000003}, DType::kF32, kNone, 6, {{{"grid_stride", 1}, {"vec", 4}, {"unroll", 8}, {"block", 128}}}});
  }
  cs.push_back({OpId::kGelu, {4099}, DType::kF32, {{"approximate", "tanh"}}, 6});
  cs.push_back({OpId::kGelu, {4099}, DType::kF16, {{"approximate", "tanh"}}, 3});
  cs.push_back({OpId::kGelu, {77777}, DType::kBF16, kNone, 2, {{{"math", 1}}}});   // fast erfc
  cs.push_back({OpId::kGelu, {4099}, DType::kF16, kNone, 2, {{{"math", 1}}}});
  cs.push_back({OpId::kRelu, {4099}, DType::kBF16, kNone, 3});
  cs.push_back({OpId::kSilu, {1025}, DType::kF16, kNone, 3});
  cs.push_back({OpId::kSigmoid, {77777}, DType::kBF16, kNone, 3});
  for (OpId op : {OpId::kLeakyRelu, OpId::kElu, OpId::kHardtanh, OpId::kHardsigmoid, OpId::kHardswish, OpId::kSoftplus,
                  OpId::kMish}) {
    cs.push_back({op, {7, 13, 5}, DType::kF32, kNone, 3});
    cs.push_back({op, {1000003}, DType::kBF16, kNone, 2});
  }
  cs.push_back({OpId::kElu, {4099}, DType::kF32, {{"alpha", 1.6732632423543772}, {"scale", 1.0507009873554805}}, 2});
  cs.push_back({OpId::kHardtanh, {4099}, DType::kF16, {{"min_val", 0}, {"max_val", 6}}, 2});
  cs.push_back({OpId::kSoftplus, {4099}, DType::kF32, {{"beta", 2.0}, {"threshold", 10.0}}, 2});
  return cs;
}

TEST_F(Gpu, Unary) { run_all(*this, unary_cases(), 2e-6); }
TEST_F(Emulated, Unary) { EXPECT_GE(run_all(*this, unary_cases(), 2e-6), 18); }

std::vector<Case> unary_backward_cases() {
  std::vector<Case> cs;
  for (OpId op : {OpId::kReluBackward, OpId::kGeluBackward, OpId::kSiluBackward, OpId::kSigmoidBackward,
                  OpId::kTanhBackward}) {
    cs.push_back({op, {3}, DType::kF32, kNone, 1});
    cs.push_back({op, {513, 7}, DType::kF32, kNone, 4});
    cs.push_back({op, {(1 << 20) + 3}, DType::kF32, kNone, 4, {{{"grid_stride", 2}, {"vec", 2}}}});
  }
  cs.push_back({OpId::kReluBackward, {1000}, DType::kF32, {{"threshold", 0.25}}, 3});
  cs.push_back({OpId::kReluBackward, {1000}, DType::kBF16, {{"threshold", 1}}, 3});
  cs.push_back({OpId::kGeluBackward, {4097}, DType::kF32, {{"approximate", "tanh"}}, 4});
  cs.push_back({OpId::kTanhBackward, {999}, DType::kF16, kNone, 3});
  for (OpId op : {OpId::kLeakyReluBackward, OpId::kEluBackward, OpId::kHardtanhBackward, OpId::kHardsigmoidBackward,
                  OpId::kHardswishBackward, OpId::kSoftplusBackward, OpId::kMishBackward}) {
    cs.push_back({op, {513, 7}, DType::kF32, kNone, 3});
    cs.push_back({op, {(1 << 20) + 3}, DType::kBF16, kNone, 2});
  }
  cs.push_back({OpId::kEluBackward, {1000}, DType::kF32, {{"is_result", true}}, 2});
  return cs;
}

TEST_F(Gpu, UnaryBackward) { run_all(*this, unary_backward_cases(), 4e-6); }
TEST_F(Emulated, UnaryBackward) { EXPECT_GE(run_all(*this, unary_backward_cases(), 4e-6), 16); }

std::vector<Case> softmax_cases() {
  std::vector<Case> cs;
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax}) {
    cs.push_back({op, {1, 1}, DType::kF32, kNone, 1});
    cs.push_back({op, {5, 7}, DType::kF32, kNone, 4});
    cs.push_back({op, {130, 33}, DType::kF32, kNone, 4, {{{"threads", 32}, {"rows", 8}, {"regs", 1}, {"vec", 1}}}});
    cs.push_back({op, {33, 1000}, DType::kF32, kNone, 8,
                  {{{"online", 1}, {"regs", 0}}, {{"online", 1}, {"regs", 1}}, {{"threads", 1024}, {"regs", 0}}}});
    cs.push_back({op, {7, 4096}, DType::kF32, kNone, 4});
    cs.push_back({op, {3, 40000}, DType::kF32, kNone, 4, {{{"threads", 32}, {"regs", 0}, {"online", 1}}}});
    cs.push_back({op, {64, 200}, DType::kF16, kNone, 3});
    cs.push_back({op, {17, 1024}, DType::kBF16, kNone, 3});
    // Fast math in 16 bits, with the row in registers, streamed, and online.
    cs.push_back({op, {65, 1000}, DType::kF16, kNone, 2,
                  {{{"math", 1}, {"regs", 1}}, {{"math", 1}, {"regs", 0}}, {{"math", 1}, {"online", 1}}, {{"math", 0}}}});
    cs.push_back({op, {9, 8192}, DType::kBF16, kNone, 2, {{{"math", 1}}, {{"math", 1}, {"threads", 1024}, {"regs", 0}}}});
  }
  return cs;
}

TEST_F(Gpu, Softmax) { run_all(*this, softmax_cases(), 1e-5); }
TEST_F(Emulated, Softmax) { EXPECT_GE(run_all(*this, softmax_cases(), 1e-5), 7); }

std::vector<Case> softmax_backward_cases() {
  std::vector<Case> cs;
  for (OpId op : {OpId::kSoftmaxBackward, OpId::kLogSoftmaxBackward}) {
    cs.push_back({op, {1, 1}, DType::kF32, kNone, 1});
    cs.push_back({op, {130, 33}, DType::kF32, kNone, 4});
    cs.push_back({op, {33, 1000}, DType::kF32, kNone, 6});
    cs.push_back({op, {3, 40000}, DType::kF32, kNone, 3});
    cs.push_back({op, {64, 200}, DType::kF16, kNone, 2});
  }
  return cs;
}

TEST_F(Gpu, SoftmaxBackward) { run_all(*this, softmax_backward_cases(), 1e-5); }
TEST_F(Emulated, SoftmaxBackward) { EXPECT_GE(run_all(*this, softmax_backward_cases(), 1e-5), 4); }

std::vector<Case> group_norm_cases() {
  std::vector<Case> cs;
  const json f32p = {{"group", 32}, {"param_dtype", "f32"}};
  // Few long rows: the split passes (several split counts) and, once, one block per row.
  // The fused cluster launch: 8 or 4 blocks a row, capped blocks an SM or not.
  cs.push_back({OpId::kGroupNorm, {16, 64, 256, 256}, DType::kF32, {{"group", 8}}, 1,
                {{{"split", 132}}, {{"split", 264}, {"threads", 512}, {"vec", 2}}, {{"split", 0}},
                 {{"fuse", 8}, {"threads", 1024}, {"resident", 1}}, {{"fuse", 4}, {"threads", 256}}}});
  cs.push_back({OpId::kGroupNorm, {16, 64, 256, 256}, DType::kBF16, {{"group", 8}, {"param_dtype", "f32"}}, 1,
                {{{"fuse", 4}, {"threads", 512}, {"resident", 2}}}});
  // U-Net shapes: moderate rows, one block per row, registers or streamed.
  cs.push_back({OpId::kGroupNorm, {8, 320, 64, 64}, DType::kF32, {{"group", 32}}, 3,
                {{{"split", 0}, {"fuse", 0}}, {{"split", 33}}, {{"fuse", 1}, {"threads", 1024}, {"resident", 1}},
                 {{"fuse", 2}, {"threads", 256}, {"resident", 0}}, {{"fuse", 4}, {"threads", 1024}, {"regs", 1}}}});
  cs.push_back({OpId::kGroupNorm, {8, 320, 64, 64}, DType::kBF16, {{"group", 32}}, 2, {{{"fuse", 2}, {"threads", 1024}, {"resident", 1}}}});
  cs.push_back({OpId::kGroupNorm, {8, 1280, 16, 16}, DType::kBF16, f32p, 3, {{{"regs", 1}, {"vec", 4}, {"threads", 1024}}}});
  cs.push_back({OpId::kGroupNorm, {8, 1280, 16, 16}, DType::kF16, {{"group", 32}}, 2});
  cs.push_back({OpId::kGroupNorm, {32, 64, 56, 56}, DType::kBF16, f32p, 3});
  cs.push_back({OpId::kGroupNorm, {32, 64, 56, 56}, DType::kF32, {{"group", 32}}, 3,
                {{{"threads", 32}, {"rows", 2}, {"regs", 0}}, {{"fuse", 1}, {"threads", 64}}}});
  // Odd small shapes: HxW not a multiple of any vector, one element per channel, no affine.
  cs.push_back({OpId::kGroupNorm, {3, 8, 7, 9}, DType::kF32, {{"group", 4}}, 4,
                {{{"fuse", 1}, {"threads", 32}}, {{"fuse", 1}, {"threads", 32}, {"regs", 1}}}});
  // Fused slices in registers that start inside a channel (400 vectors a channel, 300 a slice).
  cs.push_back({OpId::kGroupNorm, {4, 6, 40, 40}, DType::kF32, {{"group", 2}}, 1,
                {{{"fuse", 4}, {"threads", 128}, {"regs", 1}}, {{"fuse", 1}, {"threads", 512}, {"regs", 1}}}});
  cs.push_back({OpId::kGroupNorm, {2, 6, 5}, DType::kF32, {{"group", 3}, {"affine", false}}, 2});
  cs.push_back({OpId::kGroupNorm, {5, 7}, DType::kBF16, {{"group", 7}}, 2});
  // Slices of the fused launch that start inside a channel (odd HxW, scalar vectors).
  cs.push_back({OpId::kGroupNorm, {2, 4, 70001}, DType::kF32, {{"group", 2}}, 3,
                {{{"split", 66}}, {{"fuse", 8}, {"threads", 128}}, {{"fuse", 1}, {"threads", 64}}}});
  return cs;
}

TEST_F(Gpu, GroupNorm) { run_all(*this, group_norm_cases(), 2e-5); }
TEST_F(Emulated, GroupNorm) { EXPECT_GE(run_all(*this, group_norm_cases(), 2e-5), 2); }

std::vector<Case> batch_norm_cases() {
  std::vector<Case> cs;
  const json train = {{"training", true}, {"running", false}};
  const json inorm = {{"training", true}, {"running", false}, {"affine", false}};   // F.instance_norm
  const json eval = {{"training", false}};
  // The measured shapes: training (several slicings of the statistics) and eval, f32 and bf16.
  cs.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kF32, inorm, 1, {{{"bpc", 4}}, {{"bpc", 64}, {"threads", 512}, {"vec", 2}}}});
  cs.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, train, 1});
  cs.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", false}, {"param_dtype", "f32"}}, 1});
  cs.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kF32, eval, 1});
  // Instance norm's 256 KB channels, the fused slices also in registers (regs).
  cs.push_back({OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kF32, inorm, 1,
                {{{"bpc", 1}}, {{"fuse", 4}, {"threads", 1024}, {"regs", 1}}, {{"fuse", 4}, {"threads", 512}, {"regs", 1}}}});
  cs.push_back({OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kBF16, inorm, 1, {{{"fuse", 4}, {"threads", 1024}, {"regs", 1}}}});
  // Odd small shapes: HxW of 7 (vec 1), one element per channel, f16, no affine.
  cs.push_back({OpId::kBatchNorm, {3, 5, 7}, DType::kF32, train, 3, {{{"fuse", 1}, {"threads", 32}, {"regs", 1}}}});
  cs.push_back({OpId::kBatchNorm, {3, 5, 7}, DType::kF16, {{"training", false}, {"affine", false}}, 2});
  cs.push_back({OpId::kBatchNorm, {2, 4, 3, 3}, DType::kBF16, train, 2, {{{"fuse", 1}, {"threads", 64}, {"regs", 1}}}});
  // Register slices that start inside a plane and cross into the next (400 vectors a plane, 300 a slice).
  cs.push_back({OpId::kBatchNorm, {3, 8, 40, 40}, DType::kF32, train, 1,
                {{{"fuse", 4}, {"threads", 128}, {"regs", 1}}, {{"fuse", 1}, {"threads", 512}, {"regs", 1}}}});
  cs.push_back({OpId::kBatchNorm, {8, 6}, DType::kF32, eval, 2});
  cs.push_back({OpId::kBatchNorm, {1, 6, 70001}, DType::kF32, inorm, 3});
  return cs;
}

TEST_F(Gpu, BatchNorm) { run_all(*this, batch_norm_cases(), 2e-5); }
TEST_F(Emulated, BatchNorm) { EXPECT_GE(run_all(*this, batch_norm_cases(), 2e-5), 3); }

// Losses: every reduction, odd sizes (vector tails), one block and many, weights, ignored targets,
// 1d nll and nll2d, halves; the fused mean over 64 MiB and an LLM-vocabulary nll.
std::vector<Case> loss_cases() {
  std::vector<Case> cs;
  for (int64_t r : {0, 1, 2}) {
    const json red = {{"reduction", r}};
    for (DType dt : {DType::kF32, DType::kBF16}) cs.push_back({OpId::kMseLoss, {1000003}, dt, red, 3, {{{"blocks", 1}}}});
    cs.push_back({OpId::kSmoothL1Loss, {7, 13, 5}, DType::kF32, {{"reduction", r}, {"beta", 0.5}}, 3});
    cs.push_back({OpId::kSmoothL1Loss, {4099}, DType::kF16, {{"reduction", r}, {"beta", 0.0}}, 2});
    cs.push_back({OpId::kHuberLoss, {4099}, DType::kF16, {{"reduction", r}, {"delta", 2.0}}, 2});
    cs.push_back({OpId::kBinaryCrossEntropy, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}}, 3});
    cs.push_back({OpId::kBinaryCrossEntropy, {513, 7}, DType::kBF16, red, 2});
    cs.push_back({OpId::kNllLoss, {37, 11}, DType::kF32, {{"reduction", r}, {"weight", true}, {"ignore_index", 3}}, 3});
    cs.push_back({OpId::kNllLoss, {7}, DType::kF32, {{"reduction", r}, {"weight", true}}, 1});
    cs.push_back({OpId::kNllLoss, {1024, 32000}, DType::kBF16, red, 2});
    cs.push_back({OpId::kNllLoss2d, {2, 5, 7, 9}, DType::kF16, {{"reduction", r}, {"weight", r == 1}}, 2});
  }
  cs.push_back({OpId::kMseLoss, {1 << 24}, DType::kF32, kNone, 2, {{{"blocks", 2112}, {"vec", 4}, {"unroll", 4}}}});
  cs.push_back({OpId::kNllLoss, {5, 1}, DType::kF32, {{"ignore_index", 0}}, 2});   // every target ignored: nan
  return cs;
}

TEST_F(Gpu, Loss) { run_all(*this, loss_cases(), 2e-5); }
TEST_F(Emulated, Loss) { EXPECT_GE(run_all(*this, loss_cases(), 2e-5), 16); }

// bce with logits: every reduction, weight and pos_weight of self's sizes, along the last dim
// ([C] with C % 8 == 0: vectors of the parameters; odd C: none), one weight for all, halves,
// saturating logits (template_gpu_loss.cpp); the eager_gaps shape, bf16, fused mean over many blocks.
std::vector<Case> bce_with_logits_cases() {
  std::vector<Case> cs;
  for (int64_t r : {0, 1, 2}) {
    cs.push_back({OpId::kBceWithLogits, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}, {"pos_weight", true}}, 3});
    cs.push_back({OpId::kBceWithLogits, {4096, 1000}, DType::kBF16, {{"reduction", r}, {"weight", "last"}, {"pos_weight", "last"}}, 3});
    cs.push_back({OpId::kBceWithLogits, {513, 7}, DType::kF16, {{"reduction", r}, {"pos_weight", {1, 7}}, {"weight", json::array()}}, 2});
    cs.push_back({OpId::kBceWithLogits, {37, 11}, DType::kF32, {{"reduction", r}}, 2, {{{"blocks", 1}}}});
  }
  cs.push_back({OpId::kBceWithLogits, {32768, 2048}, DType::kBF16, kNone, 2, {{{"blocks", 2112}, {"vec", 8}, {"unroll", 4}}}});
  cs.push_back({OpId::kBceWithLogits, {32768, 2048}, DType::kF32, {{"pos_weight", "last"}}, 1});
  return cs;
}

TEST_F(Gpu, BceWithLogits) { run_all(*this, bce_with_logits_cases(), 2e-5); }
TEST_F(Emulated, BceWithLogits) { EXPECT_GE(run_all(*this, bce_with_logits_cases(), 2e-5), 4); }

// Loss backward: every reduction, vector tails, weights, ignored targets, 1d nll, nll2d, halves;
// smooth_l1 (beta 0: a sign, NaN at d = 0 as CUDA eager) and huber at their branch edges.
std::vector<Case> loss_backward_cases() {
  std::vector<Case> cs;
  for (int64_t r : {0, 1, 2}) {
    const json red = {{"reduction", r}};
    cs.push_back({OpId::kMseLossBackward, {1000003}, DType::kF32, red, 3});
    cs.push_back({OpId::kMseLossBackward, {4099}, DType::kBF16, red, 2});
    cs.push_back({OpId::kBinaryCrossEntropyBackward, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}}, 3});
    cs.push_back({OpId::kBinaryCrossEntropyBackward, {513, 7}, DType::kF16, red, 2});
    cs.push_back({OpId::kSmoothL1LossBackward, {1000003}, DType::kF32, {{"reduction", r}, {"beta", 0.5}}, 3});
    cs.push_back({OpId::kSmoothL1LossBackward, {4099}, DType::kF16, {{"reduction", r}, {"beta", 0.0}}, 2});
    cs.push_back({OpId::kHuberLossBackward, {513, 7}, DType::kBF16, {{"reduction", r}, {"delta", 2.0}}, 2});
    cs.push_back({OpId::kHuberLossBackward, {77777}, DType::kF32, {{"reduction", r}, {"delta", 0.7}}, 2});
    cs.push_back({OpId::kNllLossBackward, {37, 11}, DType::kF32, {{"reduction", r}, {"weight", true}, {"ignore_index", 3}}, 3});
    cs.push_back({OpId::kNllLossBackward, {1024, 32000}, DType::kBF16, red, 2});
    cs.push_back({OpId::kNllLossBackward, {7}, DType::kF32, {{"reduction", r}, {"weight", true}}, 1});
    cs.push_back({OpId::kNllLoss2dBackward, {2, 5, 7, 9}, DType::kF16, {{"reduction", r}, {"weight", r == 1}}, 2});
  }
  return cs;
}

TEST_F(Gpu, LossBackward) { run_all(*this, loss_backward_cases(), 2e-5); }
TEST_F(Emulated, LossBackward) { EXPECT_GE(run_all(*this, loss_backward_cases(), 2e-5), 15); }

// Times the default candidate (and a few split settings) of the shapes that matter most.
std::vector<Case> scan_cases() {
  std::vector<Case> cs;
  for (OpId op : {OpId::kCumsum, OpId::kCumprod, OpId::kLogcumsumexp}) {
    cs.push_back({op, {1}, DType::kF32, {{"dim", 0}}, 1});
    cs.push_back({op, {3, 37}, DType::kF32, {{"dim", -1}}, 4});
    cs.push_back({op, {5, 3, 17}, DType::kF32, {{"dim", 1}}, 4});
    cs.push_back({op, {9, 1}, DType::kF32, {{"dim", 0}}, 2});
    cs.push_back({op, {33, 1000}, DType::kF32, {{"dim", 1}}, 4, {{{"threads", 32}, {"rows", 8}}, {{"threads", 1024}, {"items", 8}}}});
    cs.push_back({op, {2, 70001}, DType::kF32, {{"dim", -1}}, 3, {{{"split", 16}, {"vec", 1}}}});
    // Few long rows (split by default) and a long strided axis (split along L by default).
    cs.push_back({op, {128, 262144}, DType::kF32, {{"dim", -1}}, 2, {{{"split", 0}}, {{"split", 64}, {"threads", 512}}}});
    cs.push_back({op, {32768, 1024}, DType::kF32, {{"dim", 0}}, 2, {{{"split", 0}}, {{"split", 32}, {"vec", 4}}}});
    cs.push_back({op, {128, 262144}, DType::kBF16, {{"dim", -1}}, 1});
    cs.push_back({op, {32768, 1024}, DType::kBF16, {{"dim", 0}}, 1});
    cs.push_back({op, {7, 3, 130}, DType::kBF16, {{"dim", 1}}, 3});
    cs.push_back({op, {64, 200}, DType::kF16, {{"dim", -1}}, 2});
  }
  return cs;
}

TEST_F(Gpu, Scan) { run_all(*this, scan_cases(), 2e-6); }
TEST_F(Emulated, Scan) { EXPECT_GE(run_all(*this, scan_cases(), 2e-6), 13); }

// Reductions: rows (odd and vector lengths, misaligned starts), columns (odd inner), few outputs (split by default),
// every dim, keepdim over two dims, each dtype; the inputs hold ties, offsets, NaN and infinities
// (prod: factors near 1, a zero and a NaN; template_gpu_reference.cpp).
std::vector<Case> reduction_cases() {
  std::vector<Case> cs;
  for (OpId op : {OpId::kSum, OpId::kMean, OpId::kAmax, OpId::kAmin, OpId::kArgmax, OpId::kArgmin, OpId::kVar, OpId::kStd,
                  OpId::kVarMean, OpId::kStdMean, OpId::kVectorNorm, OpId::kMax, OpId::kMin, OpId::kProd,
                  OpId::kLogsumexp}) {
    cs.push_back({op, {4096, 1023}, DType::kF32, {{"dim", -1}}, 2, {{{"threads", 32}, {"rows", 8}}}});
    cs.push_back({op, {64, 4096}, DType::kBF16, {{"dim", 1}}, 2, {{{"split", 4}, {"threads", 128}}}});
    cs.push_back({op, {16, 512, 255}, DType::kF32, {{"dim", 1}}, 2, {{{"tx", 8}, {"ty", 32}, {"unroll", 8}}}});
    cs.push_back({op, {512, 64, 64}, DType::kF32, {{"dim", 0}}, 2, {{{"split", 0}}, {{"split", 64}, {"vec", 4}}}});
    cs.push_back({op, {1000, 16}, DType::kBF16, {{"dim", 0}}, 2});
    cs.push_back({op, {5, 3, 17}, DType::kF16, {{"dim", 1}}, 1});
    // Rows of any length and start: misaligned heads and tails around the vector loads, rows
    // shorter than a vector, and split chunks of odd rows.
    cs.push_back({op, {1000, 77}, DType::kBF16, {{"dim", -1}}, 1, {{{"vec", 8}, {"threads", 32}}}});
    cs.push_back({op, {64, 3}, DType::kF16, {{"dim", -1}}, 1, {{{"vec", 8}}}});
    cs.push_back({op, {8, 100003}, DType::kF32, {{"dim", -1}}, 1, {{{"vec", 4}, {"split", 4}, {"unroll", 2}}}});
    // Short rows in groups of fewer lanes than a warp (several rows a warp): 330 rows leave the
    // last warp of 8 (or 4) rows two live ones, which still shuffle with their dead neighbours.
    cs.push_back({op, {330, 49}, DType::kBF16, {{"dim", -1}}, 1, {{{"threads", 8}, {"vec", 8}}, {{"threads", 4}, {"vec", 4}}}});
    // Longer rows in such groups (a choice up to 512 vectors): several rounds, a partial last one.
    cs.push_back({op, {99, 1023}, DType::kBF16, {{"dim", -1}}, 1, {{{"threads", 16}, {"vec", 8}, {"rows", 2}}, {{"threads", 8}, {"unroll", 2}}}});
    if (op == OpId::kMax || op == OpId::kMin || op == OpId::kProd) {   // one int dim; KernelBench's shape
      cs.push_back({op, {1 << 22}, DType::kF32, {{"dim", 0}}, 1});
      cs.push_back({op, {16, 256, 256}, DType::kF32, {{"dim", 1}, {"keepdim", true}}, 2});
    } else if (op == OpId::kArgmax || op == OpId::kArgmin) {
      cs.push_back({op, {1 << 22}, DType::kF32, {{"dim", "none"}}, 1});
    } else {
      const json all = op == OpId::kLogsumexp ? json{0} : json("none");   // logsumexp takes a dim list
      cs.push_back({op, {1 << 22}, DType::kF32, {{"dim", all}}, 1, {{{"split", 0}}}});
      cs.push_back({op, {8, 256, 64}, DType::kF32, {{"dim", {1, 2}}, {"keepdim", true}}, 1});
      cs.push_back({op, {2, 165, 7, 7}, DType::kF32, {{"dim", {2, 3}}}, 1, {{{"threads", 4}, {"vec", 4}}, {{"threads", 16}, {"rows", 2}}}});
    }
  }
  // Two runs around the kept dims: NCHW batch-norm statistics, odd and short inner runs, halves.
  for (OpId op : {OpId::kSum, OpId::kMean, OpId::kAmax, OpId::kAmin, OpId::kVar, OpId::kStd, OpId::kVarMean,
                  OpId::kStdMean, OpId::kVectorNorm, OpId::kLogsumexp}) {
    cs.push_back({op, {16, 64, 28, 28}, DType::kF32, {{"dim", {0, 2, 3}}}, 2, {{{"threads", 32}, {"rows", 8}}, {{"threads", 8}, {"rows", 1}, {"unroll", 2}, {"vec", 2}}}});
    cs.push_back({op, {7, 33, 5, 9}, DType::kBF16, {{"dim", {0, 2, 3}}, {"keepdim", true}}, 1, {{{"vec", 8}}}});
    cs.push_back({op, {3, 40, 1001}, DType::kF16, {{"dim", {0, 2}}}, 1, {{{"threads", 256}}}});
    cs.push_back({op, {3, 67, 7, 7}, DType::kF32, {{"dim", {0, 2, 3}}}, 1, {{{"threads", 4}, {"vec", 4}, {"rows", 1}}}});
    // More runs to merge (12) than a group has lanes: the finishing warp merges them all.
    cs.push_back({op, {12, 5, 40}, DType::kF32, {{"dim", {0, 2}}}, 1, {{{"threads", 4}, {"vec", 4}, {"rows", 1}}, {{"threads", 8}, {"unroll", 2}}}});
  }
  cs.push_back({OpId::kMean, {32, 4096}, DType::kBF16, {{"dim", 1}, {"dtype", "f32"}}, 2});
  cs.push_back({OpId::kProd, {32, 4096}, DType::kBF16, {{"dim", 1}, {"dtype", "f32"}}, 2});
  for (const json& ord : {json(1), json(3), json(INFINITY), json(-INFINITY)})
    cs.push_back({OpId::kVectorNorm, {300, 700}, DType::kF32, {{"dim", 1}, {"ord", ord}}, 2});
  cs.push_back({OpId::kVar, {64, 1000}, DType::kF32, {{"dim", 1}, {"correction", 0}}, 2});
  cs.push_back({OpId::kStd, {9, 1}, DType::kF32, {{"dim", 1}}, 1});   // r = 1: 0 / 0 is NaN, as in eager
  return cs;
}

TEST_F(Gpu, Reduction) { run_all(*this, reduction_cases(), 4e-6); }
TEST_F(Emulated, Reduction) { EXPECT_GE(run_all(*this, reduction_cases(), 4e-6), 42); }

}  // namespace
}  // namespace kc::evolve
