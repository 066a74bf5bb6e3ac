// CPU op-family templates end to end (no GPU): for every op, several shapes (odd ones included),
// the template's default knobs plus pseudo-random knob settings are rendered, the launch spec is
// parsed and resolved against the call's binding, the source is compiled with the host compiler
// (once per distinct source text), loaded and run on real buffers, serially and over threads.
// Outputs start as NaN so unwritten elements show; results are compared with double-precision
// references (template_cpu_reference.cpp), and serial and threaded runs must agree bit for bit
// (every reduction has a fixed order). A cheaper sweep renders many more knob settings without
// compiling them. The harness that renders, compiles and runs a family is template_cpu_harness.h;
// the cases are in template_cpu_cases.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "evolve/propose/proposer.h"
#include "evolve/verify/static_check.h"
#include "runtime/cpu_backend.h"
#include "runtime/launch_spec.h"
#include "tests/unit/template_cpu_cases.h"
#include "tests/unit/template_cpu_harness.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Tests.

TEST(CpuTemplates, Unary) {
  Stats st = run_family(unary_cases(), "cpu.unary");
  EXPECT_GT(st.ran, 200);
  EXPECT_TRUE(st.both("vexp"));
}

TEST(CpuTemplates, UnaryBackward) {
  Stats st = run_family(unary_backward_cases(), "cpu.unary_backward");
  EXPECT_GT(st.ran, 200);
  EXPECT_TRUE(st.both("vexp"));
}

TEST(CpuTemplates, Softmax) {
  std::vector<Case> cases = softmax_cases(false);
  // A row holding NaN turns the whole row into NaN, as PyTorch's softmax does.
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax}) {
    Case c{std::string(op_info(op).name) + "/nan-row/9x100", cpu_call(op, {9, 100}), 0, true};
    cases.push_back(c);
  }
  Stats st = run_family(cases, "cpu.softmax");
  EXPECT_GT(st.ran, 80);
  for (const char* k : {"acc", "vexp"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, SoftmaxBackward) {
  Stats st = run_family(softmax_cases(true), "cpu.softmax_backward");
  EXPECT_GT(st.ran, 80);
  for (const char* k : {"acc", "vexp"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, LayerNorm) {
  Stats st = run_family(layer_norm_cases(), "cpu.layer_norm");
  EXPECT_GT(st.ran, 150);
  for (const char* k : {"split", "acc", "stats"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, GroupNorm) {
  Stats st = run_family(group_norm_cases(), "cpu.group_norm");
  EXPECT_GT(st.ran, 60);
  for (const char* k : {"split", "simd"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, BatchNorm) {
  Stats st = run_family(batch_norm_cases(), "cpu.batch_norm");
  EXPECT_GT(st.ran, 40);
  EXPECT_TRUE(st.both("simd"));
  // Training with running statistics writes the call's inputs: eager's.
  OpCall rs = cpu_call(OpId::kBatchNorm, {2, 4, 3, 3}, {{"training", true}, {"running", true}});
  for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(rs).empty()) << t->name();
  // The CPU's eval statistics are empty tensors, in the input's dtype.
  OpCall ev = cpu_call(OpId::kBatchNorm, {2, 4, 3, 3}, {{"training", false}});
  ASSERT_EQ(ev.outputs.size(), 3u);
  EXPECT_EQ(ev.outputs[1].numel(), 0);
  EXPECT_EQ(ev.outputs[2].dtype, DType::kF32);
}

TEST(CpuTemplates, BatchNormBackward) {
  Stats st = run_family(batch_norm_backward_cases(), "cpu.batch_norm_backward");
  EXPECT_GT(st.ran, 20);
  EXPECT_TRUE(st.both("simd"));
  // grad_weight without a weight: its dtype is eager's guess (batch_norm_backward.cpp), not served.
  OpCall nw = cpu_call(OpId::kBatchNormBackward, {2, 4, 3}, {{"affine", false}, {"output_mask", {1, 1, 1}}});
  for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(nw).empty()) << t->name();
}

TEST(CpuTemplates, GroupNormBackward) {
  Stats st = run_family(group_norm_backward_cases(), "cpu.group_norm_backward");
  EXPECT_GT(st.ran, 30);
  EXPECT_TRUE(st.both("simd"));
  // grad_weight without a weight: eager refuses the call, so it has no outputs to serve.
  EXPECT_FALSE(make_call(OpId::kGroupNormBackward, {2, 4, 3}, DType::kF32, BackendKind::kCpu,
                         {{"group", 2}, {"affine", false}, {"output_mask", {1, 1, 0}}}).is_ok());
  // A reduced-precision input with fp32 parameters saved fp32 statistics (mixed type).
  auto mixed = make_call(OpId::kGroupNormBackward, {2, 4, 3}, DType::kBF16, BackendKind::kCpu, {{"group", 2}, {"param_dtype", "f32"}});
  ASSERT_TRUE(mixed.is_ok());
  EXPECT_EQ(mixed->inputs[2].dtype, DType::kF32);
  EXPECT_EQ(mixed->outputs[0].dtype, DType::kBF16);
  EXPECT_EQ(mixed->outputs[1].dtype, DType::kF32);
  for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(mixed.value()).empty()) << t->name();
}

TEST(CpuTemplates, EmbeddingBackward) {
  Stats st = run_family(embedding_backward_cases(), "cpu.embedding_backward");
  EXPECT_GT(st.ran, 10);
  EXPECT_TRUE(st.both("simd"));
}

TEST(CpuTemplates, Scan) {
  Stats st = run_family(scan_cases(), "cpu.scan");
  EXPECT_GT(st.ran, 150);
  for (const char* k : {"acc", "simd"}) EXPECT_TRUE(st.both(k)) << k;
  // A cumsum into another dtype stays eager's.
  OpCall f64 = cpu_call(OpId::kCumsum, {4, 8}, {{"dim", 1}, {"dtype", "f64"}});
  for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(f64).empty()) << t->name();
}

TEST(CpuTemplates, Reduction) {
  Stats st = run_family(reduction_cases(), "cpu.reduction");
  EXPECT_GT(st.ran, 150);
  EXPECT_TRUE(st.both("simd"));
  // Reduced dims that are neither one block nor two around the kept ones (1 and 3 of a 4-d
  // input: kept, reduced, kept, reduced) stay eager's; two runs (0 and 2 of 3-d) are served.
  OpCall apart = cpu_call(OpId::kSum, {2, 3, 4, 5}, {{"dim", {1, 3}}});
  EXPECT_EQ(apart.outputs[0].sizes, (std::vector<int64_t>{2, 4}));
  for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(apart).empty()) << t->name();
  OpCall two = cpu_call(OpId::kSum, {4, 3, 5}, {{"dim", {0, 2}}});
  bool served = false;
  for (const Template* t : cpu_templates()) served = served || !t->space(two).empty();
  EXPECT_TRUE(served);
}

TEST(CpuTemplates, Pool) {
  Stats st = run_family(pool_cases(), "cpu.pool");
  EXPECT_GT(st.ran, 0);
}

TEST(CpuTemplates, PoolBackward) {
  Stats st = run_family(pool_backward_cases(), "cpu.pool_backward");
  EXPECT_GT(st.ran, 60);
  EXPECT_TRUE(st.both("acc"));
}

TEST(CpuTemplates, Loss) {
  Stats st = run_family(loss_cases(), "cpu.loss");
  EXPECT_GT(st.ran, 300);
  for (const char* k : {"acc", "simd"}) EXPECT_TRUE(st.both(k)) << k;
  // Broadcast self and target, an int32 target (eager refuses it) and a negative beta stay eager's.
  OpCall bc = cpu_call(OpId::kMseLoss, {4, 8});
  bc.inputs[1].sizes = {1, 8};
  bc.inputs[1].strides = {8, 1};
  OpCall i32 = cpu_call(OpId::kNllLoss, {4, 8});
  i32.inputs[1].dtype = DType::kI32;
  for (const OpCall& c : {bc, i32, cpu_call(OpId::kSmoothL1Loss, {4, 8}, {{"beta", -1.0}})})
    for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(c).empty()) << t->name();
  // bce with logits: a weight that is no suffix of self's sizes ([N, 1]) and an fp64 pos_weight
  // stay eager's; one that would grow the result is refused, as eager (in place) refuses it.
  OpCall col = cpu_call(OpId::kBceWithLogits, {4, 8}, {{"weight", {4, 1}}});
  EXPECT_FALSE(make_call(OpId::kBceWithLogits, {4, 8}, DType::kF32, BackendKind::kCpu, {{"weight", {2, 1, 8}}}).is_ok());
  OpCall f64 = cpu_call(OpId::kBceWithLogits, {4, 8}, {{"pos_weight", "last"}});
  f64.inputs[3].dtype = DType::kF64;
  for (const OpCall& c : {col, f64})
    for (const Template* t : cpu_templates()) EXPECT_TRUE(t->space(c).empty()) << t->name();
}

TEST(CpuTemplates, LossBackward) {
  Stats st = run_family(loss_backward_cases(), "cpu.loss_backward");
  EXPECT_GT(st.ran, 100);
  EXPECT_TRUE(st.both("simd"));
}

TEST(CpuTemplates, LayerNormBackward) {
  Stats st = run_family(layer_norm_backward_cases(), "cpu.layer_norm_backward");
  EXPECT_GT(st.ran, 150);
  for (const char* k : {"split", "wb_rows", "acc"}) EXPECT_TRUE(st.both(k)) << k;
}

// Every knob setting of the space renders (or is kUnsupported), its spec parses and resolves
// against the binding, names only entries the source defines and only tensors that are present,
// and the source passes the static check. Up to 160 settings per call, no compiling.
TEST(CpuTemplates, EveryKnobSettingRendersOrIsUnsupported) {
  std::vector<Case> all;
  for (auto* f : {&unary_cases, &unary_backward_cases, &layer_norm_cases, &layer_norm_backward_cases, &group_norm_cases, &batch_norm_cases, &batch_norm_backward_cases, &group_norm_backward_cases, &embedding_backward_cases, &scan_cases,
                  &reduction_cases, &loss_cases, &loss_backward_cases})
    for (auto& c : (*f)()) all.push_back(std::move(c));
  for (bool bw : {false, true})
    for (auto& c : softmax_cases(bw)) all.push_back(std::move(c));
  int rendered = 0, unsupported = 0;
  std::set<std::string> checked;   // static check once per source
  for (const auto& cs : all) {
    if (cs.call.inputs.empty() || cs.call.inputs[0].numel() > (1 << 20)) continue;   // the big case: sizes only matter in specs
    const Template* t = cpu_template(cs.call);
    if (!t) continue;
    std::vector<KnobDim> space = t->space(cs.call);
    ASSERT_FALSE(space.empty());
    size_t total = 1;
    for (const auto& d : space) {
      ASSERT_FALSE(d.values.empty()) << d.name;
      std::set<int64_t> uniq(d.values.begin(), d.values.end());
      EXPECT_EQ(uniq.size(), d.values.size()) << cs.label << " knob " << d.name << " repeats a value";
      total *= d.values.size();
    }
    std::mt19937_64 rng(fnv(cs.label));
    const size_t count = std::min<size_t>(total, 160);
    for (size_t i = 0; i < count; ++i) {
      Knobs k;
      size_t idx = total <= 160 ? i : rng() % total;
      for (const auto& d : space) {
        k[d.name] = d.values[idx % d.values.size()];
        idx /= d.values.size();
      }
      auto r = t->render(cs.call, k);
      if (!r.is_ok()) {
        EXPECT_EQ(r.status().code(), Code::kUnsupported) << cs.label << ": " << r.status().to_string();
        ++unsupported;
        continue;
      }
      ++rendered;
      EXPECT_EQ(r->knobs, k) << cs.label;
      auto spec = parse_launch_spec(r->launch);
      ASSERT_TRUE(spec.is_ok()) << cs.label << " " << r->id() << ": " << spec.status().to_string();
      auto rs = resolve(spec.value(), cs.call.binding());
      ASSERT_TRUE(rs.is_ok()) << cs.label << " " << r->id() << ": " << rs.status().to_string();
      for (const auto& l : spec->launches)
        EXPECT_NE(r->source.find("extern \"C\" void " + l.entry + "("), std::string::npos) << l.entry;
      if (checked.insert(r->source).second) {
        StaticReport rep = static_check(r->source, BackendKind::kCpu, "fp32", {"f32"}, cs.call.inputs[0].numel());
        EXPECT_TRUE(rep.ok()) << cs.label << " " << r->id() << ": " << rep.to_json().dump(2);
        EXPECT_TRUE(rep.findings.empty()) << rep.to_json().dump(2);
      }
    }
  }
  std::printf("[ sweep ] %d settings rendered, %d unsupported, %zu distinct sources statically checked\n", rendered,
              unsupported, checked.size());
  EXPECT_GT(rendered, 4000);
}

// Calls the CPU templates must leave alone (eager runs them), and knob misuse.
TEST(CpuTemplates, ScopeAndKnobChecks) {
  auto first_space = [](const OpCall& c) {
    for (const Template* t : cpu_templates())
      if (!t->space(c).empty()) return std::string(t->name());
    return std::string();
  };
  OpCall ok = cpu_call(OpId::kRelu, {4, 8});
  EXPECT_EQ(first_space(ok), "cpu.unary");
  OpCall cuda = must(make_call(OpId::kRelu, {4, 8}, DType::kF32, BackendKind::kCuda));
  EXPECT_EQ(first_space(cuda), "");
  OpCall f64 = must(make_call(OpId::kRelu, {4, 8}, DType::kF64, BackendKind::kCpu));
  EXPECT_EQ(first_space(f64), "");
  OpCall strided = ok;
  strided.inputs[0].strides = {1, 4};   // transposed
  EXPECT_EQ(first_space(strided), "");
  OpCall misaligned = ok;
  misaligned.inputs[0].align = 4;
  EXPECT_EQ(first_space(misaligned), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kGelu, {4, 8}, {{"approximate", "erf"}})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kSoftmax, {4, 8}, {{"dim", 0}})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kSoftmax, {4, 8}, {{"dim", -2}})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kSoftmax, {4, 8}, {{"dim", 1}})), "cpu.softmax");
  OpCall h2f = cpu_call(OpId::kSoftmax, {4, 8});
  for (auto& s : h2f.scalars)
    if (s.name == "half_to_float") s.value = true;
  EXPECT_EQ(first_space(h2f), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kRelu, {0, 8})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kLayerNorm, {4, 8}, {{"normalized_shape", {8}}})), "cpu.layer_norm");

  const Template* t = cpu_template(ok);
  ASSERT_TRUE(t);
  auto bad_name = t->render(ok, {{"warp", 4}});
  EXPECT_EQ(bad_name.status().code(), Code::kUnsupported);
  auto bad_value = t->render(ok, {{"unroll", 3}});
  EXPECT_EQ(bad_value.status().code(), Code::kUnsupported);
  auto not_handled = t->render(cuda, {});
  EXPECT_EQ(not_handled.status().code(), Code::kUnsupported);
  auto d = t->render(ok, {});
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->knobs.size(), t->space(ok).size());   // every knob named, defaults filled in
  EXPECT_EQ(d->id(), t->render(ok, d->knobs)->id());

  // One-pass moments need double accumulation.
  OpCall ln = cpu_call(OpId::kLayerNorm, {4, 8}, {{"normalized_shape", {8}}});
  const Template* lt = cpu_template(ln);
  ASSERT_TRUE(lt);
  EXPECT_EQ(lt->render(ln, {{"stats", 1}, {"acc", 0}}).status().code(), Code::kUnsupported);
  EXPECT_TRUE(lt->render(ln, {{"stats", 1}, {"acc", 1}}).is_ok());

  // Absent optionals are never named in the spec; masked-out gradients are not written.
  OpCall lnb = cpu_call(OpId::kLayerNormBackward, {4, 8}, {{"normalized_shape", {8}}, {"affine", false}, {"output_mask", {1, 0, 0}}});
  const Template* bt = cpu_template(lnb);
  ASSERT_TRUE(bt);
  auto r = bt->render(lnb, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const std::string spec = r->launch.dump();
  for (const char* absent : {"ptr:weight", "ptr:bias", "ptr:out1", "ptr:out2"})
    EXPECT_EQ(spec.find(absent), std::string::npos) << absent << " in " << spec;
  OpCall lnf = cpu_call(OpId::kLayerNorm, {4, 8}, {{"normalized_shape", {8}}, {"affine", false}});
  auto rf = cpu_template(lnf)->render(lnf, {});
  ASSERT_TRUE(rf.is_ok());
  EXPECT_EQ(rf->launch.dump().find("ptr:weight"), std::string::npos);
  EXPECT_EQ(rf->launch.dump().find("ptr:bias"), std::string::npos);
}

// The inline exp of vexp=1 (taken from a rendered source) against exp in double, over the whole
// float range where exp is neither 0 nor inf, the overflow and denormal edges, and specials.
TEST(CpuTemplates, InlineExpWithinTwoUlp) {
  OpCall c = cpu_call(OpId::kSigmoid, {16});
  auto r = cpu_template(c)->render(c, {{"vexp", 1}});
  ASSERT_TRUE(r.is_ok());
  ASSERT_NE(r->source.find("kc_exp"), std::string::npos);
  const std::string src = r->source + R"K(
extern "C" void kc_test_exp(const kc_cpu_ctx* ctx, void* const* args) {
  float* o = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t i = b * 4096; i < n && i < (b + 1) * 4096; ++i) o[i] = kc_exp(x[i]);
}
)K";
  std::vector<float> x;
  for (float v = -106.f; v <= 90.f; v += 1.9e-4f) x.push_back(v);
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 88.72283f, 88.72284f, -87.33654f, -103.2789f, -103.9720f, INFINITY,
                  -INFINITY, NAN})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> o(n, NAN);
  Binding b;
  TensorMeta tx, to;
  tx.name = "self", tx.sizes = {n}, tx.strides = {1};
  to.name = "out0", to.sizes = {n}, to.strides = {1};
  b.tensors = {tx, to};
  auto spec = parse_launch_spec(json{{"launches", {{{"entry", "kc_test_exp"}, {"grid", {"ceil_div(numel(self), 4096)"}},
                                                    {"block", {1}}, {"args", {"ptr:out0", "ptr:self", "i64:numel(self)"}}}}}});
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  auto rs = resolve(spec.value(), b);
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  auto bin = cpu_backend().compile(src);
  ASSERT_TRUE(bin.is_ok()) << bin.status().to_string();
  auto l = cpu_backend().load(bin->binary, rs.value());
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  void* ptrs[] = {x.data(), o.data()};
  ExecContext ctx;
  ctx.parallel_for = threaded_for;
  ASSERT_TRUE(l.value()->run(ptrs, ctx).is_ok());
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  int64_t worst = 0, bad = 0;
  float worst_x = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(o[i]));
      continue;
    }
    const int64_t ulp = std::llabs(ordered(o[i]) - ordered(want));
    if (ulp > worst) worst = ulp, worst_x = x[i];
    if (ulp > 2 && bad++ < 5) ADD_FAILURE() << "exp(" << x[i] << ") = " << o[i] << ", want " << want << " (" << ulp << " ulp)";
  }
  std::printf("[ kc_exp ] %lld values, worst %lld ulp at x=%g\n", static_cast<long long>(n), static_cast<long long>(worst),
              worst_x);
  EXPECT_EQ(bad, 0);
}

// Split-row layer norm is the default where there are few long rows, and uses two launches and a
// scratch buffer; short rows stay one launch.
TEST(CpuTemplates, LayerNormSplitsLongRows) {
  OpCall big = cpu_call(OpId::kLayerNorm, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}});
  const Template* t = cpu_template(big);
  ASSERT_TRUE(t);
  auto r = t->render(big, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_NE(r->knobs.at("split"), 0);
  EXPECT_EQ(r->launch["launches"].size(), 2u);
  ASSERT_TRUE(r->launch.contains("scratch"));
  auto spec = parse_launch_spec(r->launch);
  ASSERT_TRUE(spec.is_ok());
  auto rs = resolve(spec.value(), big.binding());
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  EXPECT_GE(rs->launches[0].grid[0], 16);   // enough blocks for the threads
  OpCall small = cpu_call(OpId::kLayerNorm, {4096, 768}, {{"normalized_shape", {768}}});
  auto s = t->render(small, {});
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->knobs.at("split"), 0);
  EXPECT_EQ(s->launch["launches"].size(), 1u);
  // Work splits live in the launch spec only: one compiled source serves them all.
  auto unsplit = t->render(big, {{"split", 0}, {"rows", 1}});
  ASSERT_TRUE(unsplit.is_ok());
  EXPECT_EQ(unsplit->source, r->source);
  EXPECT_EQ(s->source, r->source);
  EXPECT_NE(unsplit->launch, r->launch);
}

}  // namespace
}  // namespace kc::evolve
