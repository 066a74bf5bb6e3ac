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
#include "tests/unit/template_cuda_cases.h"
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

using cuda_cases::Case;
using cuda_cases::cases;
using cuda_cases::describe;

using cuda_cases::call_of;
using cuda_cases::cuda_template_for;

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
    // f64 may be refused by the schema itself (cross_entropy's, as eager's checks do).
    auto f64 = make_call(info.id, k.sizes, DType::kF64, BackendKind::kCuda, k.args);
    if (f64.is_ok()) none_claims(f64.value(), std::string(info.name) + " in f64");
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
  // CUDA eager refuses fp32 weight or bias with a bf16 / f16 input (make_call does too), so no
  // template claims such a call either.
  for (OpId op : {OpId::kLayerNorm, OpId::kLayerNormBackward}) {
    OpCall mixed = call_of({op, {8, 64}, DType::kBF16, json::object()});
    for (auto& in : mixed.inputs)
      if (in.name == "weight") in.dtype = DType::kF32;
    none_claims(mixed, std::string(op_info(op).name) + " with an fp32 weight");
  }
  OpCall half_stats = call_of({OpId::kLayerNormBackward, {8, 64}, DType::kF16, json::object()});
  for (auto& in : half_stats.inputs)
    if (in.name == "mean" || in.name == "rstd") in.dtype = DType::kF16;
  none_claims(half_stats, "layer norm backward with f16 statistics");
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
  // Few rows of an input that fits L2 (U-Net, 42 MB): the fused cluster launch by default, and
  // an explicit split is the split whatever fuse's default.
  OpCall gn_unet = call_of({OpId::kGroupNorm, {8, 320, 64, 64}, DType::kF32, {{"group", 32}}});
  auto gu = cuda_template_for(gn_unet)->render(gn_unet, {});
  ASSERT_TRUE(gu.is_ok()) << gu.status().to_string();
  EXPECT_GT(gu->knobs.at("fuse"), 0);
  EXPECT_EQ(gu->knobs.at("split"), 0);
  EXPECT_EQ(gu->launch["launches"].size(), 1u);
  EXPECT_EQ(gu->launch["launches"][0]["entry"], "kc_group_norm_fused");
  auto gu_split = cuda_template_for(gn_unet)->render(gn_unet, {{"split", 33}});
  ASSERT_TRUE(gu_split.is_ok()) << gu_split.status().to_string();
  EXPECT_EQ(gu_split->knobs.at("fuse"), 0);
  EXPECT_EQ(gu_split->knobs.at("resident"), 0) << "resident caps the fused launch only";
  EXPECT_EQ(gu_split->launch["launches"].size(), 2u);
  EXPECT_EQ(gr->knobs.at("fuse"), 0) << "268 MB: the split stays the default";
  // The fused slice in registers: 4 blocks of 1024 threads, 3 vectors a thread, seeded; one block
  // would need 40 floats a thread.
  auto gu_regs = cuda_template_for(gn_unet)->render(gn_unet, {{"fuse", 4}, {"threads", 1024}, {"regs", 1}});
  ASSERT_TRUE(gu_regs.is_ok()) << gu_regs.status().to_string();
  EXPECT_NE(gu_regs->source.find(", RI = 3;"), std::string::npos);
  EXPECT_NE(gu->source.find(", RI = 0;"), std::string::npos);
  EXPECT_EQ(cuda_template_for(gn_unet)->render(gn_unet, {{"fuse", 1}, {"threads", 1024}, {"regs", 1}}).status().code(),
            Code::kUnsupported);
  const auto gu_seeds = cuda_template_for(gn_unet)->seeds(gn_unet);
  EXPECT_NE(std::find(gu_seeds.begin(), gu_seeds.end(), Knobs{{"fuse", 4}, {"threads", 1024}, {"regs", 1}}), gu_seeds.end());
  // A vector never straddles two channels: vec divides HxW (here 5 * 5 = 25: only vec 1).
  OpCall gn_odd = call_of({OpId::kGroupNorm, {2, 8, 5, 5}, DType::kF32, {{"group", 2}}});
  EXPECT_EQ(cuda_template_for(gn_odd)->render(gn_odd, {{"vec", 4}}).status().code(), Code::kUnsupported);

  // Batch norm: training is one fused launch (a cluster of blocks per channel) where a channel
  // is at most 8 slices of 256 KB, else stats + finalize + apply with scratch; eval one pass
  // writing save_mean / save_invstd ([C] fp32 on CUDA); the key never has running stats in training.
  OpCall bn = call_of({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kBF16, {{"training", true}, {"running", false}}});
  auto br = cuda_template_for(bn)->render(bn, {});
  ASSERT_TRUE(br.is_ok()) << br.status().to_string();
  EXPECT_EQ(br->knobs.at("fuse"), 8) << "2 MB channels: 8 blocks of 256 KB";
  ASSERT_EQ(br->launch["launches"].size(), 1u);
  EXPECT_NE(br->source.find("__cluster_dims__"), std::string::npos);
  auto b3 = cuda_template_for(bn)->render(bn, {{"fuse", 0}});
  ASSERT_TRUE(b3.is_ok()) << b3.status().to_string();
  EXPECT_EQ(b3->launch["launches"].size(), 3u);
  EXPECT_TRUE(b3->launch.contains("scratch"));
  EXPECT_GE(b3->knobs.at("bpc") * 64, 4 * 132);
  OpCall bn32 = call_of({OpId::kBatchNorm, {16, 64, 256, 256}, DType::kF32, {{"training", true}, {"running", false}}});
  EXPECT_EQ(cuda_template_for(bn32)->render(bn32, {})->knobs.at("fuse"), 0) << "4 MB channels: three launches";
  OpCall in = call_of({OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kF32, {{"training", true}, {"running", false}, {"affine", false}}});
  auto ir = cuda_template_for(in)->render(in, {});
  ASSERT_TRUE(ir.is_ok()) << ir.status().to_string();
  EXPECT_EQ(ir->knobs.at("fuse"), 1) << "instance norm's 256 KB planes: one block each";
  EXPECT_EQ(ir->source.find("__cluster_dims__"), std::string::npos);
  EXPECT_NE(ir->source.find(", RI = 0;"), std::string::npos) << "the default streams its slice";
  // The slice in registers: 4 blocks of 1024 threads hold a 64K-element fp32 channel (4 vectors a
  // thread); one block would need 64 floats a thread; without the fused launch there is no slice.
  const Template* bnt = cuda_template_for(in);
  auto in_regs = bnt->render(in, {{"fuse", 4}, {"threads", 1024}, {"regs", 1}});
  ASSERT_TRUE(in_regs.is_ok()) << in_regs.status().to_string();
  EXPECT_NE(in_regs->source.find(", RI = 4;"), std::string::npos);
  EXPECT_EQ(bnt->render(in, {{"fuse", 1}, {"threads", 1024}, {"regs", 1}}).status().code(), Code::kUnsupported);
  EXPECT_EQ(bnt->render(in, {{"fuse", 0}, {"regs", 1}})->knobs.at("regs"), 0);
  const auto in_seeds = bnt->seeds(in);
  EXPECT_NE(std::find(in_seeds.begin(), in_seeds.end(), Knobs{{"threads", 1024}, {"fuse", 4}, {"regs", 1}}), in_seeds.end());
  // A residency cap reserves shared memory the fused kernel does not use; nothing to cap otherwise.
  auto capped = cuda_template_for(in)->render(in, {{"fuse", 2}, {"resident", 2}});
  ASSERT_TRUE(capped.is_ok()) << capped.status().to_string();
  EXPECT_GT(capped->launch["launches"][0]["smem"].get<int64_t>(), 100 << 10);
  EXPECT_LT(capped->launch["launches"][0]["smem"].get<int64_t>(), 114 << 10) << "two blocks must fit one SM";
  EXPECT_EQ(ir->launch["launches"][0]["smem"].get<int64_t>(), 0);
  EXPECT_EQ(cuda_template_for(in)->render(in, {{"fuse", 0}, {"resident", 2}}).status().code(), Code::kUnsupported);
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
    sample_knobs.insert(sample_knobs.end(), k.extra.begin(), k.extra.end());
    for (size_t i = 0; i < sample_knobs.size(); ++i) {
      const Knobs& kn = sample_knobs[i];
      auto r = t->render(c, kn);
      if (!r.is_ok()) {
        ASSERT_NE(i, 0u) << describe(k) << ": the default knobs must render: " << r.status().to_string();
        ASSERT_LE(i, static_cast<size_t>(k.samples)) << describe(k) << ": extra settings must render: " << r.status().to_string();
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
