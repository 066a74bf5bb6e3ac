// CUDA op-family templates without a GPU: every op is covered, unhandled calls get an empty space,
// defaults always render, a deterministic sample of knob settings renders specs that parse and
// resolve against the call's binding (never naming absent tensors), passes the static check, and
// NVRTC-compiles for sm_90 (identical sources compiled once).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/propose/proposer.h"
#include "tests/unit/plain_calls.h"
#include "evolve/verify/static_check.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;   // NVRTC's compiles fail under ASan
#else
constexpr bool kAsan = false;
#endif

struct Case {
  OpId op;
  std::vector<int64_t> sizes;
  DType dt;
  json args;
  int samples = 2;   // random knob settings besides the defaults
};

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
  // Group norm: the split shape, U-Net shapes, odd ones; bf16/f16 with their own and fp32 params.
  v.push_back({OpId::kGroupNorm, {16, 64, 256, 256}, DType::kF32, {{"group", 8}}, 6});
  v.push_back({OpId::kGroupNorm, {8, 320, 64, 64}, DType::kF32, {{"group", 32}}, 6});
  v.push_back({OpId::kGroupNorm, {8, 1280, 16, 16}, DType::kBF16, {{"group", 32}, {"param_dtype", "f32"}}, 3});
  v.push_back({OpId::kGroupNorm, {32, 64, 56, 56}, DType::kBF16, {{"group", 32}}, 3});
  v.push_back({OpId::kGroupNorm, {2, 6, 5}, DType::kF16, {{"group", 3}, {"affine", false}}, 3});
  v.push_back({OpId::kGroupNorm, {3, 8, 7, 9}, DType::kF32, {{"group", 4}}});
  // Batch norm: instance norm as (1, N*C, H, W) training without running stats, bf16 eval with
  // fp32 parameters, odd shapes.
  const json bn_train = {{"training", true}, {"running", false}, {"affine", false}};
  v.push_back({OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kF32, bn_train, 6});
  v.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", true}, {"running", false}}, 3});
  v.push_back({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", false}, {"param_dtype", "f32"}}, 3});
  v.push_back({OpId::kBatchNorm, {3, 5, 7}, DType::kF16, {{"training", false}, {"affine", false}}});
  v.push_back({OpId::kBatchNorm, {2, 4, 3, 3}, DType::kF32, {{"training", true}, {"running", false}}});
  // Pooling: the measured shapes, each dtype, unbatched, ceil mode, dilation, divisor_override.
  const json p3 = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}};
  v.push_back({OpId::kMaxPool3d, {16, 32, 64, 64, 64}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 3}}, 6});
  v.push_back({OpId::kAvgPool3d, {16, 32, 64, 64, 64}, DType::kBF16, p3, 3});
  v.push_back({OpId::kAvgPool2d, {16, 64, 256, 256}, DType::kF32, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}, 6});
  v.push_back({OpId::kMaxPool2d, {16, 64, 256, 256}, DType::kF16, {{"kernel_size", 2}, {"stride", 2}}, 3});
  v.push_back({OpId::kMaxPool2d, {3, 7, 9}, DType::kF32, {{"kernel_size", {3, 2}}, {"padding", 1}, {"ceil_mode", true}}});
  v.push_back({OpId::kAvgPool2d, {1, 2, 8, 8}, DType::kBF16, {{"kernel_size", 2}, {"divisor_override", 3}}});
  v.push_back({OpId::kAvgPool3d, {2, 5, 6, 7}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1},
                                                              {"ceil_mode", true}, {"count_include_pad", false}}});
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
                  OpId::kVarMean, OpId::kStdMean, OpId::kVectorNorm}) {
    v.push_back({op, {128, 4096, 4095}, DType::kF32, {{"dim", 1}}, 4});
    v.push_back({op, {4096, 4095}, DType::kF32, {{"dim", -1}}, 4});
    v.push_back({op, {1 << 20, 16}, DType::kBF16, {{"dim", 0}}, 3});
    v.push_back({op, {5, 3, 17}, DType::kF16, {{"dim", 1}}, 2});
  }
  v.push_back({OpId::kSum, {64, 1 << 20}, DType::kF32, {{"dim", "none"}}, 4});
  v.push_back({OpId::kMean, {8, 4096, 64}, DType::kBF16, {{"dim", {1, 2}}, {"dtype", "f32"}}, 3});
  v.push_back({OpId::kVectorNorm, {256, 1000}, DType::kF32, {{"dim", "none"}, {"ord", INFINITY}}, 3});
  v.push_back({OpId::kVectorNorm, {256, 1000}, DType::kBF16, {{"dim", 1}, {"ord", 3}}, 3});
  v.push_back({OpId::kArgmax, {16, 1024}, DType::kF32, {{"dim", "none"}}, 3});
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
  // Loss backward: grad_output one value or one per term; nll's vectors along classes (nll2d:
  // along the plane).
  for (int64_t r : {0, 1, 2}) {
    v.push_back({OpId::kMseLossBackward, {1000003}, DType::kBF16, {{"reduction", r}}, 3});
    v.push_back({OpId::kBinaryCrossEntropyBackward, {77777}, DType::kF32, {{"reduction", r}, {"weight", true}}, 3});
    v.push_back({OpId::kNllLossBackward, {4096, 1000}, DType::kF16, {{"reduction", r}, {"weight", true}}, 3});
    v.push_back({OpId::kNllLoss2dBackward, {2, 5, 8, 9}, DType::kF32, {{"reduction", r}}});
  }
  v.push_back({OpId::kNllLossBackward, {7}, DType::kF32, json::object()});
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

// splitmix64: the knob sample is the same on every run and machine.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Default knobs, then `n` random settings.
std::vector<Knobs> sample(const std::vector<KnobDim>& sp, uint64_t seed, int n) {
  std::vector<Knobs> out(1);
  Rng r{seed};
  for (int i = 0; i < n; ++i) {
    Knobs k;
    for (const auto& d : sp) k[d.name] = d.values[r.next() % d.values.size()];
    out.push_back(k);
  }
  return out;
}

Case plain_case(const OpInfo& info) {
  PlainCall p = plain_call(info, 8, 64);
  return {info.id, p.sizes, DType::kF32, p.args};
}

TEST(TemplatesCuda, EveryOpHasExactlyOneCudaTemplate) {
  for (const auto& info : all_ops()) {
    Case k = plain_case(info);
    OpCall c = call_of(k);
    const Template* t = cuda_template_for(c);
    ASSERT_NE(t, nullptr) << info.name;
    EXPECT_EQ(t->backend(), BackendKind::kCuda);
    auto fams = templates_for(c);
    EXPECT_NE(std::find(fams.begin(), fams.end(), t), fams.end()) << info.name;
    // A CPU call is never claimed by a CUDA template.
    auto cpu = make_call(info.id, k.sizes, DType::kF32, BackendKind::kCpu, k.args);
    ASSERT_TRUE(cpu.is_ok());
    for (const Template* ct : cuda_templates()) EXPECT_TRUE(ct->space(cpu.value()).empty()) << ct->name();
  }
}

TEST(TemplatesCuda, UnhandledCallsHaveAnEmptySpace) {
  auto none_claims = [](const OpCall& c, const std::string& why) {
    for (const Template* t : cuda_templates()) EXPECT_TRUE(t->space(c).empty()) << t->name() << ": " << why;
  };
  for (const auto& info : all_ops()) {
    const Case k = plain_case(info);
    OpCall c = call_of(k);
    OpCall misaligned = c;
    misaligned.inputs[0].align = 8;
    none_claims(misaligned, std::string(info.name) + " with an 8-byte aligned input");
    OpCall strided = c;   // the last two dims of the first matrix-or-more input transposed
    for (auto& in : strided.inputs) {
      auto& st = in.strides;
      const size_t nd = st.size();
      if (!in.defined || nd < 2) continue;   // a loss backward's grad_output may be 0-dim or 1-dim
      st[nd - 1] = in.sizes[nd - 2];
      st[nd - 2] = 1;
      break;
    }
    none_claims(strided, std::string(info.name) + " with a transposed input");
    none_claims(call_of({info.id, k.sizes, DType::kF64, k.args}), std::string(info.name) + " in f64");
    std::vector<int64_t> empty = k.sizes;
    empty[0] = 0;
    auto e = make_call(info.id, empty, DType::kF32, BackendKind::kCuda, k.args);   // may be refused
    if (e.is_ok()) none_claims(e.value(), std::string(info.name) + " empty");
  }
  none_claims(call_of({OpId::kSoftmax, {8, 64}, DType::kF32, {{"dim", 0}}}), "softmax over dim 0");
  none_claims(call_of({OpId::kLogSoftmaxBackward, {8, 64, 2}, DType::kF32, {{"dim", -2}}}), "inner size 2");
  OpCall h2f = call_of({OpId::kSoftmax, {8, 64}, DType::kF16, json::object()});
  for (auto& s : h2f.scalars)
    if (s.name == "half_to_float") s.value = true;
  none_claims(h2f, "half_to_float");
  none_claims(call_of({OpId::kLayerNorm, {8, 64}, DType::kF16, json::object()}), "layer norm in f16");
  none_claims(call_of({OpId::kGelu, {8}, DType::kF32, {{"approximate", "erf"}}}), "unknown gelu approximation");
  none_claims(call_of({OpId::kCumsum, {8, 64}, DType::kF32, {{"dim", 1}, {"dtype", "f64"}}}), "cumsum into f64");
  OpCall bc = call_of({OpId::kMseLoss, {8, 64}, DType::kF32, json::object()});
  bc.inputs[1].sizes = {1, 64};
  bc.inputs[1].strides = {64, 1};
  none_claims(bc, "mse_loss with a broadcast target");
  none_claims(call_of({OpId::kHuberLoss, {8, 64}, DType::kF32, {{"delta", 0.0}}}), "huber_loss with delta 0");
  OpCall u8 = call_of({OpId::kNllLoss, {8, 64}, DType::kF32, json::object()});
  u8.inputs[1].dtype = DType::kU8;
  none_claims(u8, "nll_loss with a uint8 target");
}

TEST(TemplatesCuda, KnobsOutsideTheSpaceOrOverBudgetAreUnsupported) {
  OpCall relu = call_of({OpId::kRelu, {1000}, DType::kF32, json::object()});
  const Template* ew = cuda_template_for(relu);
  ASSERT_NE(ew, nullptr);
  auto bad = ew->render(relu, {{"vec", 3}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kUnsupported);
  auto heavy = ew->render(relu, {{"block", 1024}, {"vec", 4}, {"unroll", 8}});
  ASSERT_FALSE(heavy.is_ok());
  EXPECT_EQ(heavy.status().code(), Code::kUnsupported);

  OpCall odd = call_of({OpId::kSoftmax, {4, 7}, DType::kF32, json::object()});
  const Template* sm = cuda_template_for(odd);
  ASSERT_NE(sm, nullptr);
  auto v4 = sm->render(odd, {{"vec", 4}});   // 4 does not divide 7
  ASSERT_FALSE(v4.is_ok());
  EXPECT_EQ(v4.status().code(), Code::kUnsupported);
  OpCall wide = call_of({OpId::kSoftmax, {2, 65536}, DType::kF32, json::object()});
  auto regs = sm->render(wide, {{"threads", 32}, {"regs", 1}});   // 2048 floats a lane
  ASSERT_FALSE(regs.is_ok());
  EXPECT_EQ(regs.status().code(), Code::kUnsupported);
  auto ok = sm->render(wide, {{"threads", 32}, {"regs", 0}});
  EXPECT_TRUE(ok.is_ok()) << ok.status().to_string();
}

TEST(TemplatesCuda, IrrelevantKnobsAreCanonical) {
  OpCall c = call_of({OpId::kSoftmax, {64, 4096}, DType::kF32, json::object()});
  const Template* sm = cuda_template_for(c);
  auto a = sm->render(c, {{"threads", 256}, {"rows", 8}});
  auto b = sm->render(c, {{"threads", 256}, {"rows", 1}});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->id(), b->id());
  EXPECT_EQ(a->source, b->source);
  EXPECT_EQ(a->knobs.at("rows"), 1);
}

TEST(TemplatesCuda, AbsentTensorsAreNeverNamed) {
  for (const json& a : {json{{"affine", false}}, json{{"bias", false}}}) {
    OpCall c = call_of({OpId::kLayerNorm, {8, 64}, DType::kF32, a});
    const Template* t = cuda_template_for(c);
    ASSERT_NE(t, nullptr);
    auto r = t->render(c, {});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    std::string spec = r->launch.dump();
    if (!c.input("weight")->defined) {
      EXPECT_EQ(spec.find("ptr:weight"), std::string::npos) << spec;
    }
    if (!c.input("bias")->defined) {
      EXPECT_EQ(spec.find("ptr:bias"), std::string::npos) << spec;
    }
  }
  OpCall big = call_of({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32,
                        {{"normalized_shape", {64, 256, 256}}, {"affine", false}}});
  auto r = cuda_template_for(big)->render(big, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_GT(r->knobs.at("split"), 0) << "one row of 4M elements should default to the split strategy";
  EXPECT_EQ(r->launch.dump().find("ptr:weight"), std::string::npos);
  EXPECT_EQ(r->launch["launches"].size(), 2u);
  EXPECT_TRUE(r->launch.contains("scratch"));

  // Group norm: few long rows default to the split passes; absent parameters are never named.
  OpCall gn = call_of({OpId::kGroupNorm, {16, 64, 256, 256}, DType::kF32, {{"group", 8}, {"affine", false}}});
  auto gr = cuda_template_for(gn)->render(gn, {});
  ASSERT_TRUE(gr.is_ok()) << gr.status().to_string();
  EXPECT_GT(gr->knobs.at("split"), 0) << "128 rows of 512K elements should default to the split strategy";
  EXPECT_EQ(gr->launch["launches"].size(), 2u);
  EXPECT_TRUE(gr->launch.contains("scratch"));
  EXPECT_EQ(gr->launch.dump().find("ptr:weight"), std::string::npos);
  EXPECT_EQ(gr->launch.dump().find("ptr:bias"), std::string::npos);
  OpCall gn_small = call_of({OpId::kGroupNorm, {32, 64, 56, 56}, DType::kBF16, {{"group", 32}}});
  auto gs = cuda_template_for(gn_small)->render(gn_small, {});
  ASSERT_TRUE(gs.is_ok()) << gs.status().to_string();
  EXPECT_EQ(gs->knobs.at("split"), 0);
  EXPECT_NE(gs->launch.dump().find("ptr:weight"), std::string::npos);
  // A vector never straddles two channels: vec divides HxW (here 5 * 5 = 25: only vec 1).
  OpCall gn_odd = call_of({OpId::kGroupNorm, {2, 8, 5, 5}, DType::kF32, {{"group", 2}}});
  EXPECT_EQ(cuda_template_for(gn_odd)->render(gn_odd, {{"vec", 4}}).status().code(), Code::kUnsupported);

  // Batch norm: training is stats + finalize + apply with scratch; eval one pass writing
  // save_mean / save_invstd ([C] fp32 on CUDA); training with running stats is eager's.
  OpCall bn = call_of({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", true}, {"running", false}}});
  auto br = cuda_template_for(bn)->render(bn, {});
  ASSERT_TRUE(br.is_ok()) << br.status().to_string();
  EXPECT_EQ(br->launch["launches"].size(), 3u);
  EXPECT_TRUE(br->launch.contains("scratch"));
  EXPECT_GE(br->knobs.at("bpc") * 64, 4 * 132);
  OpCall be = call_of({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", false}, {"param_dtype", "f32"}}});
  ASSERT_EQ(be.outputs[1].numel(), 64);
  EXPECT_EQ(be.outputs[1].dtype, DType::kF32);
  auto ber = cuda_template_for(be)->render(be, {});
  ASSERT_TRUE(ber.is_ok()) << ber.status().to_string();
  EXPECT_EQ(ber->launch["launches"].size(), 1u);
  EXPECT_NE(ber->launch.dump().find("ptr:running_var"), std::string::npos);
  OpCall bn_rs = call_of({OpId::kBatchNorm, {16, 64, 32, 32}, DType::kBF16, {{"training", true}, {"running", true}}});
  for (const Template* t : cuda_templates()) EXPECT_TRUE(t->space(bn_rs).empty()) << t->name();
  OpCall bn_odd = call_of({OpId::kBatchNorm, {3, 5, 7}, DType::kF32, {{"training", true}, {"running", false}}});
  EXPECT_EQ(cuda_template_for(bn_odd)->render(bn_odd, {{"vec", 4}}).status().code(), Code::kUnsupported);

  OpCall gi_only = call_of({OpId::kLayerNormBackward, {8, 64}, DType::kF32, {{"output_mask", {1, 0, 0}}}});
  auto g = cuda_template_for(gi_only)->render(gi_only, {});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  std::string spec = g->launch.dump();
  EXPECT_EQ(spec.find("out1"), std::string::npos) << spec;
  EXPECT_EQ(spec.find("out2"), std::string::npos) << spec;
  OpCall gb_only = call_of({OpId::kLayerNormBackward, {8, 64}, DType::kF32, {{"output_mask", {0, 0, 1}}}});
  auto b = cuda_template_for(gb_only)->render(gb_only, {{"col_split", 4}});
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  spec = b->launch.dump();
  EXPECT_EQ(spec.find("out0"), std::string::npos) << spec;
  EXPECT_EQ(spec.find("out1"), std::string::npos) << spec;
  EXPECT_NE(spec.find("out2"), std::string::npos) << spec;
}

// The main sweep: render, parse, resolve, static check, then compile every distinct source.
TEST(TemplatesCuda, SampledKnobsRenderResolveAndCompile) {
  std::map<std::string, std::string> sources;   // source -> where it came from
  std::map<std::string, std::vector<std::string>> dtypes_of;
  std::map<std::string, int64_t> numel_of;
  int rendered = 0, unsupported = 0;
  for (const Case& k : cases()) {
    // One knob sample per op, dtype and arguments, whatever the shape: sources are mostly
    // shape-free, so shapes share compiles.
    uint64_t seed = fnv1a(std::string(op_info(k.op).name) + dtype_name(k.dt) + k.args.dump());
    OpCall c = call_of(k);
    const Template* t = cuda_template_for(c);
    ASSERT_NE(t, nullptr) << describe(k);
    auto sp = t->space(c);
    for (const auto& d : sp) ASSERT_FALSE(d.values.empty()) << describe(k) << " knob " << d.name;
    Binding b = c.binding();
    auto sample_knobs = sample(sp, seed, k.samples);
    for (size_t i = 0; i < sample_knobs.size(); ++i) {
      const Knobs& kn = sample_knobs[i];
      auto r = t->render(c, kn);
      if (!r.is_ok()) {
        ASSERT_NE(i, 0u) << describe(k) << ": the default knobs must render: " << r.status().to_string();
        ASSERT_EQ(r.status().code(), Code::kUnsupported) << describe(k) << ": " << r.status().to_string();
        ++unsupported;
        continue;
      }
      ++rendered;
      const Candidate& cand = r.value();
      std::string where = describe(k) + " " + cand.id();
      EXPECT_EQ(cand.family, t->name());
      for (const auto& d : sp) {
        ASSERT_TRUE(cand.knobs.count(d.name)) << where << " lacks knob " << d.name;
        EXPECT_NE(std::find(d.values.begin(), d.values.end(), cand.knobs.at(d.name)), d.values.end()) << where;
      }
      // Rendering is deterministic, and the returned (canonical) knobs render the same variant.
      auto again = t->render(c, cand.knobs);
      ASSERT_TRUE(again.is_ok()) << where;
      EXPECT_EQ(again->source, cand.source) << where;
      EXPECT_EQ(again->launch, cand.launch) << where;
      auto spec = parse_launch_spec(cand.launch);
      ASSERT_TRUE(spec.is_ok()) << where << ": " << spec.status().to_string() << "\n" << cand.launch.dump();
      auto rs = resolve(spec.value(), b);
      ASSERT_TRUE(rs.is_ok()) << where << ": " << rs.status().to_string() << "\n" << cand.launch.dump();
      for (const auto& l : rs->launches) {
        EXPECT_LE(l.block[0] * l.block[1] * l.block[2], 1024) << where;
        EXPECT_LE(l.grid[1], 65535) << where;
        EXPECT_NE(cand.source.find("\"C\" __global__ void __launch_bounds__"), std::string::npos);
        EXPECT_NE(cand.source.find(" " + l.entry + "("), std::string::npos) << where << " has no entry " << l.entry;
      }
      for (int64_t bytes : rs->scratch_bytes) EXPECT_GT(bytes, 0) << where;
      if (!sources.count(cand.source)) {
        sources[cand.source] = where;
        dtypes_of[cand.source] = {dtype_name(k.dt)};
        int64_t mx = 0;
        for (const auto& tm : b.tensors) if (tm.defined) mx = std::max(mx, tm.numel());
        numel_of[cand.source] = mx;
      }
    }
  }
  std::printf("%d renders (%d kUnsupported samples), %zu distinct sources\n", rendered, unsupported, sources.size());
  EXPECT_GT(rendered, 250);

  auto ts = std::chrono::steady_clock::now();
  for (const auto& [src, where] : sources) {
    StaticReport rep = static_check(src, BackendKind::kCuda, "fp32", dtypes_of[src], numel_of[src]);
    EXPECT_TRUE(rep.ok()) << where << ": " << rep.to_json().dump(1);
  }
  std::printf("static check: %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count());

  if (kAsan) GTEST_SKIP() << "NVRTC does not run under AddressSanitizer";
  auto v = nvrtc_version();
  const char* req = std::getenv("KERNELCRAFT_REQUIRE_NVRTC");
  if (!v.is_ok() && req && std::string(req) == "1") FAIL() << "NVRTC required: " << v.status().to_string();
  if (!v.is_ok()) GTEST_SKIP() << "NVRTC not loadable: " << v.status().to_string();
  auto t0 = std::chrono::steady_clock::now();
  // Two compiler threads (NVRTC programs are independent); failures are reported in order after.
  std::vector<const std::pair<const std::string, std::string>*> todo;
  for (const auto& e : sources) todo.push_back(&e);
  std::vector<Status> result(todo.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < todo.size();) {
      auto out = nvrtc_compile(todo[i]->first, 90);
      result[i] = !out.is_ok() ? out.status()
                  : out->binary.empty() ? Status::error(Code::kCompileError, "empty CUBIN") : Status::ok();
    }
  };
  std::thread helper(work);
  work();
  helper.join();
  int compiled = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    EXPECT_TRUE(result[i].is_ok()) << todo[i]->second << ": " << result[i].to_string() << "\n" << todo[i]->first;
    compiled += result[i].is_ok();
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("NVRTC %s: %d sources compiled for sm_90 in %.1f s\n", v.value().c_str(), compiled, s);
}

}  // namespace
}  // namespace kc::evolve
