// The numerics stage's error model (evolve/verify/numerics.h): an honest reduction in another order
// passes where its statistic is near zero; wrong reductions fail by far; a poor eager does not
// open the budget past the model's cap.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "evolve/ops/eager.h"
#include "evolve/ops/pool.h"
#include "evolve/ops/reference.h"
#include "evolve/verify/numerics.h"
#include "evolve/propose/proposer.h"
#include "tests/unit/plain_calls.h"

namespace kc::evolve {
namespace {

OpCall call_of(OpId op, std::vector<int64_t> sizes) {
  auto c = make_call(op, sizes, DType::kF32, BackendKind::kCpu);
  EXPECT_TRUE(c.is_ok());
  return c.value();
}

InputSet set_of(const OpCall& c, const std::string& kind, uint64_t seed = 7) {
  auto s = reference_set(c, kind, make_inputs(c, kind, seed, at::kCPU));
  EXPECT_TRUE(s.is_ok());
  return std::move(s.value());
}

// Row means of x [rows, n] in float, reduced like a warp: 32 strided lane sums, then a butterfly.
at::Tensor tree_mean(const at::Tensor& x) {
  at::Tensor xc = x.contiguous(), out = at::empty({x.size(0)}, x.options());
  const int64_t rows = x.size(0), n = x.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = xc.data_ptr<float>() + r * n;
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      lane[l] = 0.f;
      for (int64_t c = l; c < n; c += 32) lane[l] += p[c];
    }
    for (int off = 16; off > 0; off /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
      std::copy(next, next + 32, lane);
    }
    out[r] = lane[0] / static_cast<float>(n);
  }
  return out;
}

// Row means accumulated in fp16 (every partial sum rounded to half), optionally skipping the last.
at::Tensor half_mean(const at::Tensor& x, bool skip_last) {
  at::Tensor xc = x.contiguous(), out = at::empty({x.size(0)}, x.options());
  for (int64_t r = 0; r < x.size(0); ++r) {
    const float* p = xc.data_ptr<float>() + r * x.size(1);
    c10::Half acc = 0.f;
    float exact = 0.f;
    for (int64_t c = 0; c < x.size(1) - (skip_last ? 1 : 0); ++c) acc = acc + c10::Half(p[c]), exact += p[c];
    out[r] = (skip_last ? exact : static_cast<float>(acc)) / static_cast<float>(x.size(1));
  }
  return out;
}

std::optional<nlohmann::json> check_mean(const OpCall& c, const InputSet& s, const at::Tensor& mean) {
  at::Tensor m = s.ref[1].clone();
  m.view(-1).copy_(mean);
  return compare("mean", m, s, 1);
}

// The measured false reject: two honest warp-reduction layer norms' means were 2.1e-7 from eager's
// (-0.000770330 for -0.000770543) on rows of 768 N(0,1) values, where eager (on the GPU) had
// rounded its mean almost exactly. Relative to the mean's own size that is outside the old budget;
// relative to what was summed (sum |x| ~ 614) it is ~2 ulp, well inside the model. A warp-order
// mean computed here passes too.
// same_bits compares bytes (on the device as a byte view): a 0-dim tensor, a loss's mean, once
// threw there, so every CUDA key with a 0-dim output was rejected at numerics. The CUDA half runs
// where a device is present.
TEST(Numerics, SameBitsOfZeroDimTensors) {
  for (bool cuda : {false, true}) {
    if (cuda && !at::hasCUDA()) continue;
    const at::Device dev = cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
    const at::Tensor a = at::full({}, 1.5f, at::TensorOptions().device(dev)), c = at::full({}, 2.5f, a.options());
    EXPECT_TRUE(same_bits(a, a.clone())) << dev;
    EXPECT_FALSE(same_bits(a, c)) << dev;
  }
}

// Input draws (evolve/ops/eager.cpp): a small tensor is the seed's generator drawn in order, as it
// always was; a large one (drawn in parallel chunks) is still a function of the seed alone, and its
// chunks are not copies of each other.
TEST(Inputs, LargeDrawsAreAFunctionOfTheSeed) {
  const OpCall small = call_of(OpId::kRelu, {1000});
  auto g = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor direct = at::empty({1000}).normal_(0, 1, g);
  EXPECT_TRUE(at::equal(make_inputs(small, "normal", 11, at::kCPU)[0], direct));

  const int64_t chunk = int64_t{1} << 22;
  const OpCall big = call_of(OpId::kRelu, {3 * chunk + 5});
  const at::Tensor a = make_inputs(big, "normal", 11, at::kCPU)[0];
  EXPECT_TRUE(at::equal(a, make_inputs(big, "normal", 11, at::kCPU)[0]));
  EXPECT_FALSE(at::equal(a, make_inputs(big, "normal", 12, at::kCPU)[0]));
  EXPECT_FALSE(at::equal(a.narrow(0, 0, 1000), a.narrow(0, chunk, 1000)));
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(a.std().item<double>(), 1.0, 1e-3);
}

TEST(Numerics, TreeOrderMeanNearZeroPasses) {
  OpCall c = call_of(OpId::kLayerNorm, {256, 768});
  InputSet s = set_of(c, "normal");
  s.ref[1] = s.ref64[1].to(at::kFloat);   // a lucky eager
  s.eager_err[1] = rel_err(s.ref[1], s.ref[1], s.ref64[1], s.tau[1], nullptr, at::Tensor());
  attach_tolerance(c, s);
  EXPECT_FALSE(check_mean(c, s, tree_mean(s.inputs[0].reshape({256, 768}))).has_value());
  at::Tensor measured = (s.ref64[1].reshape(-1) + 2.1e-7).to(at::kFloat);
  EXPECT_FALSE(check_mean(c, s, measured).has_value());
  EXPECT_GT(s.worst[1], 0.0);
  EXPECT_LT(s.worst[1], 0.1);
  // The old budget: max(4 eager, 16 eps) sqrt(K)/8 in the mixed measure.
  const double old_budget = std::max(4 * s.eager_err[1], 16 * 1.19e-7) * std::sqrt(768.0) / 8;
  EXPECT_GT(rel_err(measured.view(s.ref[1].sizes()), s.ref[1], s.ref64[1], s.tau[1], nullptr, at::Tensor()),
            old_budget);
}

TEST(Numerics, WrongReductionsFailByFar) {
  OpCall c = call_of(OpId::kLayerNorm, {256, 768});
  InputSet s = set_of(c, "normal");
  at::Tensor x = s.inputs[0].reshape({256, 768});
  for (bool skip : {false, true}) {
    auto bad = check_mean(c, s, half_mean(x, skip));
    ASSERT_TRUE(bad.has_value()) << (skip ? "skipped element" : "fp16 accumulation");
    EXPECT_GT(bad->value("ratio", 0.0), 30.0) << bad->dump();
  }
}

// Where eager is poor (its layer-norm backward, b x + c, cancels on offset rows), a candidate 3x as
// far from fp64 as eager passed the old 4x eager's error; the model's cap rejects it.
TEST(Numerics, PoorEagerDoesNotOpenTheBudget) {
  struct Case { OpId op; const char* kind; };
  for (Case k : {Case{OpId::kLayerNormBackward, "offset"}}) {
    OpCall c = call_of(k.op, {256, 768});
    InputSet s = set_of(c, k.kind);
    EXPECT_GT(s.eager_ratio[0], 1.0 / 3) << k.kind;
    at::Tensor far = (s.ref64[0] + 3 * (s.ref[0].to(at::kDouble) - s.ref64[0])).to(at::kFloat);
    auto bad = compare("out", far, s, 0);
    ASSERT_TRUE(bad.has_value()) << k.kind;
    EXPECT_LT(bad->value("budget", 1e9), 4 * s.eager_err[0]) << bad->dump();
    // eager itself is kept as evidence; an honest result (fp64 rounded to float) passes.
    EXPECT_FALSE(compare("out", s.ref64[0].to(at::kFloat), s, 0).has_value()) << k.kind;
  }
}

// A set whose references were computed elsewhere (the recheck's fresh set) gets the same model.
TEST(Numerics, AttachToleranceMatchesReferenceSet) {
  OpCall c = call_of(OpId::kSoftmax, {64, 1000});
  InputSet s = set_of(c, "offset");
  InputSet t;
  t.inputs = s.inputs;
  t.ref = s.ref;
  t.ref64 = s.ref64;
  t.tau = s.tau;
  t.eager_err = s.eager_err;
  attach_tolerance(c, t);
  ASSERT_EQ(t.tol.size(), 1u);
  EXPECT_TRUE(at::equal(t.tol[0], s.tol[0]));
  EXPECT_DOUBLE_EQ(t.budget[0], s.budget[0]);
}

// Batch norm's model works a slice of the batch at a time (an 8 GiB key otherwise held several
// fp64 copies of its input). Three slices of 2^20 elements give what the formula gives over the
// whole tensor at once (batch_norm_reference.cpp), for every output, training and eval.
TEST(Numerics, BatchNormModelBySlicesIsTheWholeFormula) {
  for (bool train : {true, false}) {
    auto made = make_call(OpId::kBatchNorm, {3, 2, 512, 1024}, DType::kF32, BackendKind::kCpu,
                          {{"training", train}, {"running", true}, {"affine", true}});
    ASSERT_TRUE(made.is_ok());
    const OpCall& c = made.value();
    std::vector<at::Tensor> in = make_inputs(c, "offset", 3, at::kCPU);
    const auto& fam = family_reference(OpFamily::kBatchNorm);
    const double eps = c.double_arg("eps", 1e-5);
    at::Tensor x = in[0].to(at::kDouble).reshape({3, 2, -1});
    auto ch = [](const at::Tensor& t) { return t.to(at::kDouble).reshape({1, 2, 1}); };
    at::Tensor mean = train ? x.mean(at::IntArrayRef{0, 2}, true) : ch(in[3]);
    at::Tensor var = train ? (x - mean).square().mean(at::IntArrayRef{0, 2}, true) : ch(in[4]);
    at::Tensor is = (var + eps).rsqrt(), mabs = x.abs().mean(at::IntArrayRef{0, 2}, true);
    const double g = std::sqrt(3.0 * 512 * 1024);
    at::Tensor w = ch(in[1]), b = ch(in[2]), d = x - mean;
    at::Tensor h = (x.abs() + mean.abs()) * (is * w).abs() + b.abs() + (d * is * w + b).abs();
    if (train) h = h + (d.abs() + mabs) * (is * w).abs() * g;
    std::vector<at::Tensor> want = {
        h.reshape(in[0].sizes()),
        train ? (mean.abs() + mabs * g).reshape({2}) : mean.abs().reshape({2}),
        train ? ((var / (var + eps)) * g + 1).mul(is).reshape({2}) : is.reshape({2})};
    for (size_t j = 0; j < want.size(); ++j)
      if (c.outputs[j].numel() > 0)   // eval's statistics are empty on the CPU
        EXPECT_TRUE(at::allclose(fam.whole(c, in, j), want[j], 1e-9, 0)) << "train " << train << " output " << j;
  }
}

// The elementwise losses' model works a slice of rows at a time. mse's terms are v = d^2 with
// h = |2 v| + |v|, so over three slices of (3000, 1000): reduction none gives 3 d^2 per term, and
// mean gives (sqrt(n) sum|v| + sum h) / n + |sum v| / n, the sums taken over all n terms at once.
TEST(Numerics, LossModelBySlicesIsTheWholeFormula) {
  for (int64_t reduction : {0, 1}) {
    auto made = make_call(OpId::kMseLoss, {3000, 1000}, DType::kF32, BackendKind::kCpu, {{"reduction", reduction}});
    ASSERT_TRUE(made.is_ok());
    const OpCall& c = made.value();
    std::vector<at::Tensor> in = make_inputs(c, "normal", 5, at::kCPU);
    at::Tensor v = (in[0].to(at::kDouble) - in[1].to(at::kDouble)).square();
    const double n = 3e6, s = v.sum().item<double>();
    at::Tensor got = family_reference(OpFamily::kLoss).whole(c, in, 0);
    if (reduction == 0) EXPECT_TRUE(at::allclose(got, 3 * v, 1e-12, 0));
    else EXPECT_NEAR(got.item<double>(), (std::sqrt(n) * s + 3 * s) / n + s / n, 1e-9 * s);
  }
}

// Elementwise ops keep eager's evidence: 4x its error, at least 16 ulp of |r64| + tau.
TEST(Numerics, ElementwiseKeepsEagersBudget) {
  OpCall c = call_of(OpId::kGelu, {256, 768});
  InputSet s = set_of(c, "normal");
  EXPECT_NEAR(s.budget[0], std::max(4 * s.eager_err[0], 16 * 1.19e-7), 1e-9);
}

// A reduction over a leading axis: the model is computed in row layout and put back in order.
TEST(Numerics, SoftmaxOverDimZero) {
  auto c = make_call(OpId::kSoftmax, {300, 40}, DType::kF32, BackendKind::kCpu, {{"dim", 0}});
  ASSERT_TRUE(c.is_ok());
  InputSet s = set_of(c.value(), "large");
  EXPECT_FALSE(compare("out", s.ref64[0].to(at::kFloat), s, 0).has_value());
  EXPECT_TRUE(compare("out", at::softmax(s.inputs[0], 1), s, 0).has_value());
}

// Losses (evolve/ops/loss_reference.cpp): an fp32 sum in another order and fp64 rounded to float
// pass; the mean of nll over every target instead of the non-ignored ones' weight, a mean
// accumulated in bf16 and an mse mean missing a tail of terms fail by far. The drawn targets are
// classes or ignore_index, never a float kind.
TEST(Numerics, LossModelPassesHonestAndRejectsWrongMeans) {
  auto nll = make_call(OpId::kNllLoss, {4096, 100}, DType::kF32, BackendKind::kCpu, {{"weight", true}});
  ASSERT_TRUE(nll.is_ok());
  InputSet s = set_of(nll.value(), "normal");
  const at::Tensor t = s.inputs[1];
  EXPECT_TRUE(((t.ge(0) & t.lt(100)) | t.eq(-100)).all().item<bool>());
  EXPECT_GT(t.eq(-100).sum().item<int64_t>(), 4096 / 16);
  EXPECT_FALSE(compare("out0", s.ref64[0].to(at::kFloat), s, 0).has_value());
  EXPECT_FALSE(compare("out1", s.ref64[1].to(at::kFloat), s, 1).has_value());
  const double n = 4096;
  at::Tensor by_count = (s.ref64[0] * s.ref64[1] / n).to(at::kFloat);
  auto bad = compare("out0", by_count, s, 0);
  ASSERT_TRUE(bad.has_value());
  EXPECT_GT(bad->value("ratio", 0.0), 30.0) << bad->dump();

  auto mse = make_call(OpId::kMseLoss, {1 << 20}, DType::kF32, BackendKind::kCpu);
  ASSERT_TRUE(mse.is_ok());
  InputSet m = set_of(mse.value(), "offset");
  at::Tensor d2 = (m.inputs[0] - m.inputs[1]).square();
  at::Tensor blocked = d2.reshape({1024, 1024}).sum(1).sum().div(1 << 20);   // another fp32 order
  EXPECT_FALSE(compare("out0", blocked, m, 0).has_value());
  at::Tensor bf16_acc = at::zeros({}, at::kBFloat16);
  for (int64_t b = 0; b < 1024; ++b) bf16_acc += d2.narrow(0, b * 1024, 1024).sum().to(at::kBFloat16);
  bad = compare("out0", bf16_acc.to(at::kFloat).div(1 << 20), m, 0);
  ASSERT_TRUE(bad.has_value());
  EXPECT_GT(bad->value("ratio", 0.0), 5.0) << bad->dump();
  // One term of 2^20 is inside sqrt(n) ulp of the sum (as in every reduction model here); a
  // dropped tail of 2^13 is not.
  bad = compare("out0", d2.narrow(0, 0, (1 << 20) - (1 << 13)).sum().div(1 << 20), m, 0);
  ASSERT_TRUE(bad.has_value()) << "a mean missing its last 2^13 terms";
  EXPECT_GT(bad->value("ratio", 0.0), 5.0) << bad->dump();
}

// bce with logits (evolve/ops/loss_reference.cpp logits_terms): eager's own fp32 answer and fp64
// rounded to float pass the model on every input kind (the large and extreme ones saturate the
// sigmoid: 1e3-scale and 1e4 logits, where the two parts of a term cancel), for parameters of
// self's sizes and broadcast ones, whose inferred outputs are eager's. The naive
// log(1 + exp(-x)), which overflows below x = -88, and a loss that forgets pos_weight fail.
TEST(Numerics, BceWithLogitsModel) {
  using nlohmann::json;
  for (const json& args : {json{{"pos_weight", true}, {"weight", true}, {"reduction", 0}},
                           json{{"pos_weight", "last"}, {"weight", {1, 64}}},
                           json{{"weight", {300, 1}}, {"pos_weight", {1}}, {"reduction", 0}},
                           json{{"pos_weight", "last"}, {"reduction", 2}}}) {
    auto c = make_call(OpId::kBceWithLogits, {300, 64}, DType::kF32, BackendKind::kCpu, args);
    ASSERT_TRUE(c.is_ok()) << args.dump();
    for (const std::string& kind : input_kinds(OpId::kBceWithLogits)) {
      SCOPED_TRACE(args.dump() + " " + kind);
      InputSet s = set_of(c.value(), kind);
      ASSERT_EQ(s.ref[0].sizes().vec(), c->outputs[0].sizes);
      EXPECT_FALSE(compare("out0", s.ref[0], s, 0).has_value());
      EXPECT_FALSE(compare("out0", s.ref64[0].to(at::kFloat), s, 0).has_value());
    }
  }
  auto c = make_call(OpId::kBceWithLogits, {300, 64}, DType::kF32, BackendKind::kCpu,
                     {{"pos_weight", "last"}, {"reduction", 0}});
  ASSERT_TRUE(c.is_ok());
  InputSet s = set_of(c.value(), "large");
  const at::Tensor &x = s.inputs[0], &t = s.inputs[1], &p = s.inputs[3];
  const at::Tensor lw = (p - 1) * t + 1;
  EXPECT_TRUE(compare("out0", (1 - t) * x + lw * (-x).exp().log1p(), s, 0).has_value()) << "exp(-x) overflows";
  EXPECT_TRUE(compare("out0", (1 - t) * x - at::log_sigmoid(x), s, 0).has_value()) << "pos_weight dropped";
}

// Layer norm in halves (rounds_once): the fp32 model plus one rounding to the output's dtype, not
// the model in the half's precision (which allowed 16 bf16 ulp of |r64| + tau, 12.5%). fp64
// rounded to the dtype passes, 4 unit roundoffs off fails, and where |out| >= 1 the tolerance is
// under 2 roundoffs of it. The CPU saves statistics in the input's dtype, so outputs 1 and 2
// round once too; grad_weight's and grad_bias' column sums as well.
TEST(Numerics, HalfLayerNormBudgetIsOneRounding) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const double ur = dt == DType::kBF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const at::ScalarType st = dt == DType::kBF16 ? at::kBFloat16 : at::kHalf;
    for (OpId op : {OpId::kLayerNorm, OpId::kLayerNormBackward}) {
      auto c = make_call(op, {64, 768}, dt, BackendKind::kCpu);
      ASSERT_TRUE(c.is_ok());
      InputSet s = set_of(c.value(), "normal");
      for (size_t j = 0; j < s.ref64.size(); ++j) {
        if (!s.ref64[j].defined()) continue;
        const std::string what = std::string(op_info(op).name) + " " + dtype_name(dt) + " out" + std::to_string(j);
        ASSERT_EQ(s.ref[j].scalar_type(), st) << what;
        EXPECT_FALSE(compare("out", s.ref64[j].to(st), s, j).has_value()) << what;
        EXPECT_TRUE(compare("out", (s.ref64[j] * (1 + 4 * ur)).to(st), s, j).has_value()) << what;
        if (j > 0) continue;
        const at::Tensor big = s.ref64[j].abs() >= 1;
        ASSERT_GT(big.sum().item<int64_t>(), 0) << what;
        const double rel = (s.tol[j].to(at::kDouble) / s.ref64[j].abs()).masked_select(big).max().item<double>();
        EXPECT_LT(rel, 2 * ur) << what;
      }
    }
  }
}

}  // namespace
}  // namespace kc::evolve

namespace kc::evolve {
namespace {

// Every row of runtime/ops.def is a complete operator: a call and its key, input kinds, eager and
// fp64 references shaped as the inferred outputs, an error budget per output, and at least one
// template on each backend. A row added without the rest fails here, not in a user's process.
TEST(OpSpec, EveryOperatorInTheTableIsComplete) {
  for (const auto& info : all_ops()) {
    SCOPED_TRACE(info.name);
    const PlainCall p = plain_call(info, 6, 48);
    for (BackendKind backend : {BackendKind::kCpu, BackendKind::kCuda}) {
      auto c = make_call(info.id, p.sizes, DType::kF32, backend, p.args);
      ASSERT_TRUE(c.is_ok()) << c.status().to_string();
      ASSERT_FALSE(c.value().outputs.empty());
      EXPECT_FALSE(templates_for(c.value()).empty()) << "no " << backend_name(backend) << " template";
    }
    auto c = make_call(info.id, p.sizes, DType::kF32, BackendKind::kCpu, p.args).value();
    ASSERT_FALSE(input_kinds(info.id).empty());
    for (const std::string& kind : input_kinds(info.id)) {
      auto s = reference_set(c, kind, make_inputs(c, kind, 3, at::kCPU));
      ASSERT_TRUE(s.is_ok()) << kind << ": " << s.status().to_string();
      ASSERT_EQ(s.value().ref.size(), c.outputs.size()) << kind;
      for (size_t j = 0; j < c.outputs.size(); ++j) {
        if (!c.outputs[j].defined) continue;
        EXPECT_EQ(s.value().ref[j].sizes().vec(), c.outputs[j].sizes) << kind << " out" << j;
        EXPECT_EQ(s.value().ref64[j].sizes().vec(), c.outputs[j].sizes) << kind << " out" << j;
        EXPECT_GT(s.value().budget[j], 0.0) << kind << " out" << j;
      }
    }
  }
}

// Channels-last pooling backward: the grad_input layout the schema infers (channels-last for the
// 2d ops and max_pool3d, contiguous for avg and adaptive 3d) is the one CPU eager produces, so
// reference sets build (numerics.cpp refuses a key whose eager layout differs).
TEST(OpSpec, ChannelsLastPoolBackwardLayoutIsEagers) {
  const nlohmann::json win = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"channels_last", true}};
  const nlohmann::json ada = {{"output_size", {2, 3, 4}}, {"channels_last", true}};
  for (OpId op : {OpId::kMaxPool2dBackward, OpId::kAvgPool2dBackward, OpId::kAdaptiveAvgPool2dBackward,
                  OpId::kMaxPool3dBackward, OpId::kAvgPool3dBackward, OpId::kAdaptiveAvgPool3dBackward}) {
    SCOPED_TRACE(op_info(op).name);
    const bool d3 = pool_op(op)->nd == 3;
    nlohmann::json args = pool_op(op)->kind == PoolKind::kAdaptive ? ada : win;
    if (!d3 && args.contains("output_size")) args["output_size"] = {3, 4};
    auto c = make_call(op, d3 ? std::vector<int64_t>{2, 6, 5, 7, 9} : std::vector<int64_t>{2, 6, 7, 9}, DType::kF32,
                       BackendKind::kCpu, args);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_TRUE(is_channels_last(c->inputs[1]));
    EXPECT_EQ(is_channels_last(c->outputs[0]), !d3 || op == OpId::kMaxPool3dBackward);
    auto s = reference_set(c.value(), "normal", make_inputs(c.value(), "normal", 3, at::kCPU));
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  }
}

}  // namespace
}  // namespace kc::evolve
