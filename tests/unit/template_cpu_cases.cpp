// Cases of the CPU template tests; see template_cpu_cases.h.
#include "tests/unit/template_cpu_cases.h"

#include <cmath>

#include <nlohmann/json.hpp>

namespace kc::evolve {
namespace {

using nlohmann::json;

const std::vector<std::vector<int64_t>> kShapes = {{1}, {1, 1}, {3, 37}, {7, 1000}, {2, 4097}, {5, 3, 17}, {300007}};

struct LnShape {
  std::vector<int64_t> sizes, normalized;
  double offset;
};
const std::vector<LnShape> kLnShapes = {
    {{1, 1}, {1}, 0.5},          {{3, 37}, {37}, 0.5},       {{7, 1000}, {1000}, 100},  {{2, 4097}, {4097}, 0.5},
    {{2, 3, 5, 7}, {5, 7}, 0.5}, {{100, 64}, {64}, -3},      {{2, 300000}, {300000}, 0.5},   // split by default
    {{1, 3, 70001}, {3, 70001}, 4}};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Cases.


std::vector<Case> unary_cases() {
  std::vector<Case> v;
  for (const auto& s : kShapes) {
    for (OpId op : {OpId::kRelu, OpId::kSilu, OpId::kSigmoid, OpId::kTanh})
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s)});
    for (const char* a : {"none", "tanh"})
      v.push_back({std::string("gelu-") + a + "/" + shape_str(s), cpu_call(OpId::kGelu, s, {{"approximate", a}})});
    for (OpId op : {OpId::kLeakyRelu, OpId::kElu, OpId::kHardtanh, OpId::kHardsigmoid, OpId::kHardswish, OpId::kSoftplus,
                    OpId::kMish})
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s)});
    // selu and relu6 reach elu and hardtanh with other scalars; softplus with beta 2.
    v.push_back({"elu-selu/" + shape_str(s), cpu_call(OpId::kElu, s, {{"alpha", 1.6732632423543772}, {"scale", 1.0507009873554805}})});
    v.push_back({"hardtanh-relu6/" + shape_str(s), cpu_call(OpId::kHardtanh, s, {{"min_val", 0}, {"max_val", 6}})});
    v.push_back({"softplus-b2/" + shape_str(s), cpu_call(OpId::kSoftplus, s, {{"beta", 2.0}, {"threshold", 10.0}})});
  }
  return v;
}

std::vector<Case> unary_backward_cases() {
  std::vector<Case> v;
  for (const auto& s : kShapes) {
    for (OpId op : {OpId::kSiluBackward, OpId::kSigmoidBackward, OpId::kTanhBackward})
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s)});
    for (const char* a : {"none", "tanh"})
      v.push_back({std::string("gelu_backward-") + a + "/" + shape_str(s),
                   cpu_call(OpId::kGeluBackward, s, {{"approximate", a}})});
    v.push_back({"threshold_backward-i0/" + shape_str(s), cpu_call(OpId::kReluBackward, s, {{"threshold", 0}})});
    v.push_back({"threshold_backward-d0.5/" + shape_str(s), cpu_call(OpId::kReluBackward, s, {{"threshold", 0.5}})});
    for (OpId op : {OpId::kLeakyReluBackward, OpId::kEluBackward, OpId::kHardtanhBackward, OpId::kHardsigmoidBackward,
                    OpId::kHardswishBackward, OpId::kSoftplusBackward, OpId::kMishBackward})
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s)});
    v.push_back({"elu_backward-result/" + shape_str(s), cpu_call(OpId::kEluBackward, s, {{"is_result", true}})});
  }
  return v;
}

std::vector<Case> softmax_cases(bool backward) {
  std::vector<Case> v;
  const std::vector<std::pair<std::vector<int64_t>, double>> shapes = {
      {{1, 1}, 0}, {{1}, 0}, {{3, 37}, 0}, {{7, 1000}, 100}, {{2, 4097}, 0}, {{5, 3, 17}, 0}, {{64, 33}, -20}, {{2, 70001}, 0}};
  for (const auto& [s, off] : shapes) {
    for (OpId op : backward ? std::vector<OpId>{OpId::kSoftmaxBackward, OpId::kLogSoftmaxBackward}
                            : std::vector<OpId>{OpId::kSoftmax, OpId::kLogSoftmax}) {
      const int64_t dim = s.size() == 2 && s[0] == 7 ? 1 : -1;   // a positive last dim too
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s, {{"dim", dim}}), off});
    }
  }
  return v;
}


std::vector<Case> layer_norm_cases() {
  std::vector<Case> v;
  for (const auto& s : kLnShapes) {
    const std::string sh = shape_str(s.sizes) + "/ns" + shape_str(s.normalized);
    v.push_back({"layer_norm-wb/" + sh, cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}}), s.offset});
    v.push_back({"layer_norm-none/" + sh,
                 cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}, {"affine", false}}), s.offset});
    v.push_back({"layer_norm-w/" + sh,
                 cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}, {"bias", false}}), s.offset});
    Case b{"layer_norm-b/" + sh, cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}}), s.offset};
    for (auto& t : b.call.inputs)
      if (t.name == "weight") {
        t.defined = false;
        t.sizes.clear();
        t.strides.clear();
      }
    v.push_back(b);
  }
  // The brief's large case: M=1, N=4M (split rows by default).
  v.push_back({"layer_norm-wb/1x64x256x256",
               cpu_call(OpId::kLayerNorm, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}}), 1.0});
  return v;
}

// Group norm: (n, g) rows of C / group * HxW; weight only and bias only by dropping one tensor.
std::vector<Case> group_norm_cases() {
  struct GnShape {
    std::vector<int64_t> sizes;
    int64_t group;
    double offset;
  };
  const std::vector<GnShape> shapes = {{{2, 6, 5}, 3, 0.5},       {{3, 8, 7, 9}, 4, 100},   {{1, 4, 70001}, 2, 4},
                                       {{4, 6}, 2, -3},           {{2, 5, 3, 3}, 1, 0.5}};
  auto without = [](Case c, const char* name) {
    for (auto& t : c.call.inputs)
      if (t.name == name) {
        t.defined = false;
        t.sizes.clear();
        t.strides.clear();
      }
    return c;
  };
  std::vector<Case> v;
  for (const auto& s : shapes) {
    const std::string sh = shape_str(s.sizes) + "/g" + std::to_string(s.group);
    const json a = {{"group", s.group}};
    Case wb{"group_norm-wb/" + sh, cpu_call(OpId::kGroupNorm, s.sizes, a), s.offset};
    v.push_back(wb);
    v.push_back({"group_norm-none/" + sh, cpu_call(OpId::kGroupNorm, s.sizes, {{"group", s.group}, {"affine", false}}), s.offset});
    Case w = without(wb, "bias"), b = without(wb, "weight");
    w.label = "group_norm-w/" + sh;
    b.label = "group_norm-b/" + sh;
    v.push_back(w);
    v.push_back(b);
  }
  return v;
}

// Batch norm: training without running statistics and eval with them, affine or not, odd
// shapes, one long channel row (1, 6, 70001) and offset inputs (cancellation in the moments).
std::vector<Case> batch_norm_cases() {
  struct BnShape {
    std::vector<int64_t> sizes;
    double offset;
  };
  const std::vector<BnShape> shapes = {{{3, 5, 7}, 0.5}, {{2, 4, 3, 3}, 100}, {{1, 6, 70001}, 4}, {{4, 6}, -3}, {{2, 3, 64}, 100}};
  std::vector<Case> v;
  for (const auto& s : shapes)
    for (bool train : {true, false})
      for (bool affine : {true, false}) {
        const std::string label = std::string("batch_norm-") + (train ? "train" : "eval") + (affine ? "-wb/" : "-none/") + shape_str(s.sizes);
        v.push_back({label, cpu_call(OpId::kBatchNorm, s.sizes, {{"training", train}, {"running", !train}, {"affine", affine}}), s.offset});
      }
  return v;
}

// Batch norm backward: training (saved statistics) and eval (running ones), with and without
// a weight, every output mask, odd shapes, a long channel row and offset inputs (x - mean).
std::vector<Case> batch_norm_backward_cases() {
  const std::vector<std::pair<std::vector<int64_t>, double>> shapes = {{{3, 5, 7}, 0.5}, {{2, 4, 3, 3}, 100}, {{1, 6, 70001}, 4}, {{4, 6}, -3}};
  std::vector<Case> v;
  for (const auto& [sizes, offset] : shapes)
    for (bool train : {true, false})
      for (bool affine : {true, false}) {
        const std::string label = std::string("batch_norm_backward-") + (train ? "train" : "eval") + (affine ? "-w/" : "-none/") + shape_str(sizes);
        v.push_back({label, cpu_call(OpId::kBatchNormBackward, sizes, {{"train", train}, {"affine", affine}}), offset});
      }
  for (const json& mask : {json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}})
    for (bool train : {true, false})
      v.push_back({std::string("batch_norm_backward-mask") + mask.dump() + (train ? "-train" : "-eval"),
                   cpu_call(OpId::kBatchNormBackward, {2, 3, 17}, {{"train", train}, {"output_mask", mask}}), 2});
  return v;
}

// Group norm backward: with and without a weight, every output mask, one group, one channel per
// group, HxW = 1, a long row (1, 4, 70001) and offset inputs (x - mean).
std::vector<Case> group_norm_backward_cases() {
  struct GnShape {
    std::vector<int64_t> sizes;
    int64_t group;
    double offset;
  };
  const std::vector<GnShape> shapes = {{{2, 6, 5}, 3, 0.5}, {{3, 8, 7, 9}, 4, 100}, {{1, 4, 70001}, 2, 4},
                                       {{4, 6}, 2, -3},     {{2, 5, 3, 3}, 1, 0.5},  {{2, 4, 11}, 4, 100}};
  std::vector<Case> v;
  for (const auto& s : shapes)
    for (bool affine : {true, false}) {
      const std::string label = std::string("group_norm_backward-") + (affine ? "w/" : "none/") + shape_str(s.sizes) + "/g" +
                                std::to_string(s.group);
      v.push_back({label, cpu_call(OpId::kGroupNormBackward, s.sizes, {{"group", s.group}, {"affine", affine}}), s.offset});
    }
  for (const json& mask : {json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}, json{0, 1, 0}})
    v.push_back({std::string("group_norm_backward-mask") + mask.dump(),
                 cpu_call(OpId::kGroupNormBackward, {2, 6, 17}, {{"group", 3}, {"output_mask", mask}}), 2});
  return v;
}

// Embedding backward: indices of rank 1 and 2 (int64 and int32), few rows (long buckets) and
// many (most empty), padding_idx a row or -1, scale_grad_by_freq, D of 1 and odd.
std::vector<Case> embedding_backward_cases() {
  struct S {
    std::vector<int64_t> sizes;
    json args;
  };
  const std::vector<S> shapes = {{{40, 7}, {{"num_weights", 5}, {"padding_idx", 2}}},
                                 {{3, 9, 16}, {{"num_weights", 300}, {"index_dtype", "i32"}}},
                                 {{64, 1}, {{"num_weights", 3}, {"padding_idx", 0}, {"scale_grad_by_freq", true}}},
                                 {{2, 5, 33}, {{"num_weights", 17}, {"padding_idx", 16}, {"scale_grad_by_freq", true}, {"index_dtype", "i32"}}},
                                 {{1, 8}, {{"num_weights", 1}}}};
  std::vector<Case> v;
  for (const auto& s : shapes)
    v.push_back({"embedding_backward-" + s.args.dump() + "/" + shape_str(s.sizes), cpu_call(OpId::kEmbeddingBackward, s.sizes, s.args)});
  return v;
}

// Pooling: 2d and 3d, batched and not, padding, dilation, ceil mode (a last window clipped and one
// dropped), count_include_pad off, divisor_override, broadcast lists and the empty stride.
std::vector<Case> pool_cases() {
  struct P {
    OpId op;
    std::vector<int64_t> sizes;
    json args;
  };
  const std::vector<P> ps = {
      {OpId::kMaxPool2d, {2, 3, 8, 8}, json::object()},
      {OpId::kMaxPool2d, {3, 7, 9}, {{"kernel_size", {3, 2}}, {"stride", {2, 1}}, {"padding", {1, 1}}}},
      {OpId::kMaxPool2d, {2, 2, 11, 13}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}, {"ceil_mode", true}}},
      {OpId::kMaxPool2d, {1, 2, 5, 6}, {{"kernel_size", 2}, {"stride", json::array()}, {"ceil_mode", true}}},
      {OpId::kMaxPool3d, {2, 2, 7, 9, 10}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 3}}},
      {OpId::kMaxPool3d, {3, 5, 6, 7}, {{"kernel_size", {2, 3, 2}}, {"stride", 1}, {"ceil_mode", true}}},
      // The values alone (aten::max_pool2d / 3d wanting no gradient)
      {OpId::kMaxPool2dValues, {2, 2, 11, 13}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}, {"ceil_mode", true}}},
      {OpId::kMaxPool3dValues, {2, 2, 7, 9, 10}, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}},
      {OpId::kAvgPool2d, {2, 3, 9, 10}, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}},
      {OpId::kAvgPool2d, {2, 3, 9, 10}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"count_include_pad", false}}},
      {OpId::kAvgPool2d, {3, 11, 7}, {{"kernel_size", {3, 2}}, {"stride", 2}, {"padding", {1, 0}}, {"ceil_mode", true}}},
      {OpId::kAvgPool2d, {1, 2, 8, 8}, {{"kernel_size", 2}, {"divisor_override", 3}}},
      {OpId::kAvgPool3d, {2, 2, 7, 9, 10}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}},
      {OpId::kAvgPool3d, {2, 5, 6, 7}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true},
                                        {"count_include_pad", false}}},
      {OpId::kAvgPool3d, {1, 3, 4, 5, 6}, {{"kernel_size", {1, 2, 3}}, {"divisor_override", 5}}},
      // Adaptive: non-divisible sizes (overlapping windows), upsampling (Out > In), global, 3d.
      {OpId::kAdaptiveAvgPool2d, {2, 3, 10, 7}, {{"output_size", {3, 4}}}},
      {OpId::kAdaptiveAvgPool2d, {3, 5, 3}, {{"output_size", {7, 5}}}},
      {OpId::kAdaptiveAvgPool2d, {2, 4, 7, 7}, {{"output_size", 1}}},
      {OpId::kAdaptiveAvgPool3d, {2, 2, 5, 9, 6}, {{"output_size", {2, 4, 3}}}},
      {OpId::kAdaptiveAvgPool3d, {3, 4, 5, 6}, {{"output_size", 1}}},
  };
  std::vector<Case> v;
  for (const auto& p : ps)
    v.push_back({std::string(op_info(p.op).name) + "/" + shape_str(p.sizes) + p.args.dump(), cpu_call(p.op, p.sizes, p.args)});
  return v;
}

// Pooling backward: overlapping windows (stride < kernel: several windows per element) and
// non-overlapping ones, padding, ceil mode, dilation (max), count_include_pad off and
// divisor_override (avg), adaptive with non-divisible sizes; sizes are self's.
std::vector<Case> pool_backward_cases() {
  struct P {
    OpId op;
    std::vector<int64_t> sizes;
    json args;
  };
  const json k3s2p1 = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}};
  const std::vector<P> ps = {
      {OpId::kMaxPool2dBackward, {2, 3, 8, 8}, json::object()},
      {OpId::kMaxPool2dBackward, {2, 3, 13, 11}, k3s2p1},
      {OpId::kMaxPool2dBackward, {3, 7, 9}, {{"kernel_size", {3, 2}}, {"stride", 1}, {"padding", {1, 1}}}},
      {OpId::kMaxPool2dBackward, {2, 2, 11, 13}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}, {"ceil_mode", true}}},
      {OpId::kMaxPool3dBackward, {2, 2, 7, 9, 10}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 2}}},
      {OpId::kMaxPool3dBackward, {3, 5, 6, 7}, {{"kernel_size", {2, 3, 2}}, {"stride", 1}, {"ceil_mode", true}}},
      {OpId::kAvgPool2dBackward, {2, 3, 9, 10}, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}},
      {OpId::kAvgPool2dBackward, {2, 3, 9, 10}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"count_include_pad", false}}},
      {OpId::kAvgPool2dBackward, {3, 11, 7}, {{"kernel_size", {3, 2}}, {"stride", 2}, {"padding", {1, 0}}, {"ceil_mode", true}}},
      {OpId::kAvgPool2dBackward, {1, 2, 8, 8}, {{"kernel_size", 2}, {"divisor_override", 3}}},
      {OpId::kAvgPool3dBackward, {2, 2, 7, 9, 10}, k3s2p1},
      {OpId::kAvgPool3dBackward, {2, 5, 6, 7}, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"ceil_mode", true},
                                                {"count_include_pad", false}}},
      {OpId::kAvgPool3dBackward, {1, 3, 4, 5, 6}, {{"kernel_size", {1, 2, 3}}, {"stride", 1}, {"divisor_override", 5}}},
      {OpId::kAdaptiveAvgPool2dBackward, {2, 3, 10, 7}, {{"output_size", {3, 4}}}},
      {OpId::kAdaptiveAvgPool2dBackward, {3, 5, 3}, {{"output_size", {7, 5}}}},
      {OpId::kAdaptiveAvgPool2dBackward, {2, 4, 7, 7}, {{"output_size", 1}}},
      {OpId::kAdaptiveAvgPool3dBackward, {2, 2, 5, 9, 6}, {{"output_size", {2, 4, 3}}}},
  };
  std::vector<Case> v;
  for (const auto& p : ps)
    v.push_back({std::string(op_info(p.op).name) + "/" + shape_str(p.sizes) + p.args.dump(), cpu_call(p.op, p.sizes, p.args)});
  return v;
}

std::vector<Case> layer_norm_backward_cases() {
  std::vector<Case> v;
  for (const auto& s : kLnShapes) {
    const std::string sh = shape_str(s.sizes) + "/ns" + shape_str(s.normalized);
    auto mk = [&](const char* tag, json args) {
      args["normalized_shape"] = s.normalized;
      v.push_back({std::string("layer_norm_backward-") + tag + "/" + sh, cpu_call(OpId::kLayerNormBackward, s.sizes, args)});
    };
    mk("wb-111", json::object());
    mk("wb-100", {{"output_mask", {1, 0, 0}}});
    mk("wb-011", {{"output_mask", {0, 1, 1}}});
    mk("w-110", {{"bias", false}, {"output_mask", {1, 1, 0}}});
    mk("none-100", {{"affine", false}, {"output_mask", {1, 0, 0}}});
  }
  return v;
}

// Scans: odd sizes, the last dim (negative and positive), dim 0 and a middle dim (strided
// columns), a long row, L = 1 both ways, and an explicit output dtype equal to the input's.
std::vector<Case> scan_cases() {
  std::vector<Case> v;
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> shapes = {
      {{3, 37}, -1}, {{7, 1000}, 1}, {{300, 33}, 0}, {{5, 3, 17}, 1}, {{5, 3, 17}, 0}, {{2, 70001}, -1},
      {{9, 1}, -1},  {{1, 9}, 0},    {{4, 1, 6}, 1}, {{1}, 0},        {{4, 513, 3}, -2}};
  for (OpId op : {OpId::kCumsum, OpId::kCumprod, OpId::kLogcumsumexp})
    for (const auto& [s, dim] : shapes)
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s) + "/dim" + std::to_string(dim),
                   cpu_call(op, s, {{"dim", dim}})});
  v.push_back({"cumsum/dtype-f32/6x50", cpu_call(OpId::kCumsum, {6, 50}, {{"dim", 1}, {"dtype", "f32"}})});
  return v;
}

// Reductions: the last dim (rows), dim 0 and a middle dim (columns), several adjacent dims, every
// dim ("none" and the empty list), a reduced size-1 dim between reduced ones, keepdim, r = 1,
// a long row, an offset (the variance's cancellation), and each norm order; max / min / prod
// take one int dim (prod's factors lie near 1: template_cpu_harness.cpp).
std::vector<Case> reduction_cases() {
  std::vector<Case> v;
  const std::vector<std::pair<std::vector<int64_t>, json>> shapes = {
      {{3, 37}, -1},     {{7, 1000}, json{1}}, {{300, 33}, 0},       {{5, 3, 17}, 1},        {{5, 3, 17}, json{0, 1}},
      {{5, 3, 17}, json{-1, -2}}, {{9, 1}, -1}, {{4, 1, 6}, json{0, 1, 2}}, {{2, 70001}, -1}, {{6, 50}, "none"}};
  const std::vector<OpId> ops = {OpId::kSum,    OpId::kMean,    OpId::kAmax,       OpId::kAmin, OpId::kArgmax,
                                 OpId::kArgmin, OpId::kVar,     OpId::kStd,        OpId::kVarMean, OpId::kStdMean,
                                 OpId::kVectorNorm, OpId::kMax, OpId::kMin,        OpId::kProd,
                                 OpId::kLogsumexp};
  for (OpId op : ops)
    for (const auto& [s, dim] : shapes) {
      const bool needs_one = op == OpId::kMax || op == OpId::kMin || op == OpId::kProd;   // one int dim
      const bool one = needs_one || op == OpId::kArgmax || op == OpId::kArgmin;          // argmax: or none
      if ((one && dim.is_array() && dim.size() != 1) || (needs_one && dim.is_string())) continue;
      if (op == OpId::kLogsumexp && !dim.is_array()) continue;   // its dim is a list, never absent
      json d = one && dim.is_array() ? dim[0] : dim;
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s) + "/dim" + d.dump(), cpu_call(op, s, {{"dim", d}})});
    }
  for (OpId op : {OpId::kSum, OpId::kArgmax, OpId::kStdMean, OpId::kMax, OpId::kProd, OpId::kLogsumexp})
    v.push_back({std::string(op_info(op).name) + "/keepdim/5x3x17", cpu_call(op, {5, 3, 17}, {{"dim", 1}, {"keepdim", true}})});
  v.push_back({"sum/empty-list/4x9", cpu_call(OpId::kSum, {4, 9}, {{"dim", json::array()}})});
  // Two runs around the kept dims (batch-norm statistics), with a size-1 dim inside a run.
  for (OpId op : {OpId::kSum, OpId::kMean, OpId::kAmax, OpId::kVarMean, OpId::kStd, OpId::kVectorNorm, OpId::kLogsumexp}) {
    v.push_back({std::string(op_info(op).name) + "/two-runs/6x5x7x11", cpu_call(op, {6, 5, 7, 11}, {{"dim", {0, 2, 3}}})});
    v.push_back({std::string(op_info(op).name) + "/two-runs-keep/3x1x9x40x2", cpu_call(op, {3, 1, 9, 40, 2}, {{"dim", {0, 1, 3, 4}}, {"keepdim", true}})});
  }
  Case off{"var/offset/40x300", cpu_call(OpId::kVar, {40, 300}, {{"dim", 1}, {"correction", 0}})};
  off.offset = 1000;
  v.push_back(off);
  for (const auto& [name, ord] : std::vector<std::pair<const char*, json>>{{"1", 1}, {"3.5", 3.5}, {"inf", INFINITY}, {"-inf", -INFINITY}})
    v.push_back({std::string("vector_norm/ord") + name + "/30x70", cpu_call(OpId::kVectorNorm, {30, 70}, {{"dim", 1}, {"ord", ord}})});
  return v;
}

}  // namespace kc::evolve

namespace kc::evolve {

// Losses: every reduction at odd sizes and one long enough for several blocks; smooth_l1 with
// beta 0 (l1) and 0.5, huber with delta 2; bce with and without weight (exact 0 and 1 inputs hit
// the log clamp); nll with and without class weights, the default and a class as ignore_index,
// 1d self, every target ignored (mean: 0 / 0 = nan), nll2d; bce with logits without parameters,
// with weight and pos_weight of self's sizes, along the last dim ([C], [1, C]), over the last two
// dims and one weight for all (saturating logits: template_cpu_loss.cpp).
std::vector<Case> loss_cases() {
  std::vector<Case> v;
  auto add = [&](OpId op, std::vector<int64_t> s, json a) {
    v.push_back({std::string(op_info(op).name) + "/" + shape_str(s) + a.dump(), cpu_call(op, s, a)});
  };
  for (int64_t r : {0, 1, 2}) {
    for (const auto& s : std::vector<std::vector<int64_t>>{{1}, {3, 37}, {300007}}) {
      add(OpId::kMseLoss, s, {{"reduction", r}});
      add(OpId::kSmoothL1Loss, s, {{"reduction", r}, {"beta", 0.5}});
      add(OpId::kHuberLoss, s, {{"reduction", r}, {"delta", 2.0}});
      add(OpId::kBinaryCrossEntropy, s, {{"reduction", r}, {"weight", r != 2}});
    }
    add(OpId::kSmoothL1Loss, {7, 100}, {{"reduction", r}, {"beta", 0.0}});
    add(OpId::kBinaryCrossEntropy, {5, 3, 17}, {{"reduction", r}});
    add(OpId::kNllLoss, {37, 11}, {{"reduction", r}});
    add(OpId::kNllLoss, {37, 11}, {{"reduction", r}, {"weight", true}, {"ignore_index", 3}});
    add(OpId::kNllLoss, {20001, 7}, {{"reduction", r}, {"weight", true}});
    add(OpId::kNllLoss, {7}, {{"reduction", r}, {"weight", true}});
    add(OpId::kNllLoss2d, {2, 5, 7, 9}, {{"reduction", r}, {"weight", r == 1}});
    for (const auto& s : std::vector<std::vector<int64_t>>{{1}, {3, 37}, {300007}}) {
      add(OpId::kBceWithLogits, s, {{"reduction", r}});
      add(OpId::kBceWithLogits, s, {{"reduction", r}, {"weight", true}, {"pos_weight", "last"}});
    }
    add(OpId::kBceWithLogits, {700, 33}, {{"reduction", r}, {"pos_weight", true}});
    add(OpId::kBceWithLogits, {700, 33}, {{"reduction", r}, {"weight", {1, 33}}, {"pos_weight", "last"}});
    add(OpId::kBceWithLogits, {5, 3, 17}, {{"reduction", r}, {"weight", {3, 17}}});
    add(OpId::kBceWithLogits, {5, 3, 17}, {{"reduction", r}, {"weight", json::array()}, {"pos_weight", {1, 1, 17}}});
  }
  add(OpId::kNllLoss, {5, 1}, {{"reduction", 1}, {"ignore_index", 0}});
  add(OpId::kNllLoss, {5, 1}, {{"reduction", 2}, {"ignore_index", 0}, {"weight", true}});
  return v;
}

// Loss backward: every reduction (grad_output one value or one per term), weights, ignored
// targets, 1d nll, nll2d, a long nll row (several targets a block); smooth_l1 with beta 0.5 and 0
// (a sign, -1 at d = 0 on CPU) and huber with delta 2, with d = 0, -0, +-beta exactly and NaN
// (template_cpu_loss.cpp edge_inputs).
std::vector<Case> loss_backward_cases() {
  std::vector<Case> v;
  auto add = [&](OpId op, std::vector<int64_t> s, json a) {
    v.push_back({std::string(op_info(op).name) + "/" + shape_str(s) + a.dump(), cpu_call(op, s, a)});
  };
  for (int64_t r : {0, 1, 2}) {
    for (const auto& s : std::vector<std::vector<int64_t>>{{1}, {3, 37}, {70001}}) {
      add(OpId::kMseLossBackward, s, {{"reduction", r}});
      add(OpId::kBinaryCrossEntropyBackward, s, {{"reduction", r}, {"weight", r != 2}});
      add(OpId::kSmoothL1LossBackward, s, {{"reduction", r}, {"beta", 0.5}});
      add(OpId::kHuberLossBackward, s, {{"reduction", r}, {"delta", 2.0}});
    }
    add(OpId::kSmoothL1LossBackward, {7, 100}, {{"reduction", r}, {"beta", 0.0}});
    add(OpId::kNllLossBackward, {37, 11}, {{"reduction", r}, {"weight", true}, {"ignore_index", 3}});
    add(OpId::kNllLossBackward, {300, 1000}, {{"reduction", r}});
    add(OpId::kNllLossBackward, {7}, {{"reduction", r}, {"weight", true}});
    add(OpId::kNllLoss2dBackward, {2, 5, 7, 9}, {{"reduction", r}, {"weight", r == 1}});
  }
  return v;
}

}  // namespace kc::evolve
