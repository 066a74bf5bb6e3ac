// The CUDA templates' default settings for the families where a default was measured on the
// H200 (pooling bakes its window, half layer norm loads 16 bytes, cross-entropy's long-row
// geometry and launches): the rendered knobs and launch specs, without a GPU.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "evolve/propose/proposer.h"
#include "tests/unit/template_cuda_cases.h"

namespace kc::evolve {
namespace {

using nlohmann::json;
using cuda_cases::call_of;
using cuda_cases::cuda_template_for;

// cuda.pool: the baked kernel is the default (window in the source, not in the arguments), the
// runtime kernel stays reachable, knobs a variant ignores are canonical, a register span too wide
// for the registers is kUnsupported, strips of output rows go with the baked kernel where windows
// overlap along H, and adaptive calls offer the runtime kernel only.
TEST(TemplatesCuda, PoolBakesTheWindowByDefault) {
  const json m3 = {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}, {"dilation", 3}};
  OpCall c = call_of({OpId::kMaxPool3d, {16, 32, 64, 64, 64}, DType::kF32, m3});
  const Template* t = cuda_template_for(c);
  ASSERT_NE(t, nullptr);
  auto def = t->render(c, {});
  ASSERT_TRUE(def.is_ok()) << def.status().to_string();
  EXPECT_EQ(def->knobs, (Knobs{{"bake", 1}, {"gs", 0}, {"il", 1}, {"regs", 0}, {"stage", 0}, {"threads", 256}, {"vl", 1}, {"vpt", 2},
                               {"vst", 0}}));
  EXPECT_NE(def->source.find("constexpr int KT = 3, KH = 3, KW = 3;"), std::string::npos);
  EXPECT_NE(def->source.find("constexpr int DT = 3, DH = 3, DW = 3;"), std::string::npos);
  // Outputs, input, rows and six sizes; the runtime kernel adds 12 window values, divisor, pad flag.
  EXPECT_EQ(def->launch["launches"][0]["args"].size(), 10u);
  auto rt = t->render(c, {{"bake", 0}, {"il", 0}, {"regs", 1}});
  auto rt2 = t->render(c, {{"bake", 0}, {"il", 1}, {"regs", 0}});
  ASSERT_TRUE(rt.is_ok() && rt2.is_ok());
  EXPECT_EQ(rt->id(), rt2->id());
  EXPECT_EQ(rt->source.find("constexpr int KT"), std::string::npos);
  EXPECT_EQ(rt->launch["launches"][0]["args"].size(), 24u);
  auto span = t->render(c, {{"regs", 1}, {"il", 1}});
  ASSERT_TRUE(span.is_ok());
  EXPECT_EQ(span->knobs.at("il"), 0);   // a register span needs consecutive outputs
  // Staged stores go with consecutive outputs only (il 0, vpt > 1), and a block whose staging
  // does not fit the static shared memory is kUnsupported (indices add 8 bytes an output).
  EXPECT_EQ(t->render(c, {{"stage", 1}, {"il", 1}})->knobs.at("stage"), 0);
  EXPECT_EQ(t->render(c, {{"stage", 1}, {"il", 0}, {"vpt", 1}})->knobs.at("stage"), 0);
  auto staged = t->render(c, {{"stage", 1}, {"il", 0}});
  ASSERT_TRUE(staged.is_ok()) << staged.status().to_string();
  EXPECT_NE(staged->source.find("STAGE = true"), std::string::npos);
  EXPECT_EQ(t->render(c, {{"stage", 1}, {"il", 0}, {"vpt", 8}, {"threads", 1024}}).status().code(), Code::kUnsupported);
  // The register-span seeds stage 8 outputs a thread, not 4 (the dilated max_pool1d's two seeds).
  OpCall mp1 = call_of({OpId::kMaxPool2dValues, {64, 192, 1, 16384}, DType::kBF16,
                        {{"kernel_size", {1, 8}}, {"stride", {1, 1}}, {"padding", {0, 4}}, {"dilation", {1, 3}}}});
  const std::vector<Knobs> mp1_seeds = t->seeds(mp1);
  ASSERT_GE(mp1_seeds.size(), 2u);
  EXPECT_EQ(mp1_seeds[0].at("vpt"), 4);
  EXPECT_EQ(mp1_seeds[0].at("stage"), 0);
  EXPECT_EQ(mp1_seeds[1].at("vpt"), 8);
  EXPECT_EQ(mp1_seeds[1].at("stage"), 1);
  // Vector stores: consecutive, unstaged outputs only; each span seed with them instead of its
  // stores comes after the others, in the same order.
  EXPECT_EQ(t->render(c, {{"vst", 1}, {"il", 1}})->knobs.at("vst"), 0);
  EXPECT_EQ(t->render(c, {{"vst", 1}, {"il", 0}, {"stage", 1}})->knobs.at("vst"), 0);
  auto vst = t->render(c, {{"vst", 1}, {"il", 0}});
  ASSERT_TRUE(vst.is_ok()) << vst.status().to_string();
  EXPECT_NE(vst->source.find("VST = true"), std::string::npos);
  ASSERT_GE(mp1_seeds.size(), 4u);
  Knobs first_vst = mp1_seeds[0], second_vst = mp1_seeds[1];
  first_vst["vst"] = 1;
  second_vst["vst"] = 1;
  second_vst["stage"] = 0;
  EXPECT_EQ(mp1_seeds[mp1_seeds.size() - 2], first_vst);
  EXPECT_EQ(mp1_seeds.back(), second_vst);

  // Strips of output rows: baked only, offered where the strip's windows share input rows (not at
  // stride 2 with dilation 3, nor where windows do not overlap), launched over strips.
  for (const auto& d : t->space(c)) EXPECT_NE(d.name, "rows");
  OpCall k2 = call_of({OpId::kMaxPool2d, {8, 64, 112, 112}, DType::kF32, {{"kernel_size", 2}, {"stride", 2}}});
  for (const auto& d : t->space(k2)) EXPECT_NE(d.name, "rows");
  OpCall s1 = call_of({OpId::kAvgPool2d, {16, 64, 256, 256}, DType::kF32, {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}});
  auto strip = t->render(s1, {{"rows", 4}});
  ASSERT_TRUE(strip.is_ok()) << strip.status().to_string();
  EXPECT_EQ(strip->knobs.at("rows"), 4);
  EXPECT_NE(strip->source.find("constexpr int ROWS = 4;"), std::string::npos);
  EXPECT_NE(strip->launch.dump().find("ceil_div(size(out0, -2), 4)"), std::string::npos);
  EXPECT_EQ(t->render(s1, {{"bake", 0}, {"rows", 4}})->id(), t->render(s1, {{"bake", 0}})->id());
  OpCall stem = call_of({OpId::kMaxPool2d, {32, 64, 112, 112}, DType::kF32, {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}});
  bool four = false;   // 9 rows for 4 outputs instead of 12
  for (const auto& d : t->space(stem)) four = four || (d.name == "rows" && d.values == std::vector<int64_t>{1, 4});
  EXPECT_TRUE(four);
  // Strips are the default only where they load at most half the rows (3x3 stride 1: 6 of 12),
  // with 4 outputs a row; the stem keeps single rows of 2.
  auto s1_def = t->render(s1, {});
  ASSERT_TRUE(s1_def.is_ok());
  EXPECT_EQ(s1_def->knobs.at("rows"), 4);
  EXPECT_EQ(s1_def->knobs.at("vpt"), 4);
  auto stem_def = t->render(stem, {});
  ASSERT_TRUE(stem_def.is_ok());
  EXPECT_EQ(stem_def->knobs.at("rows"), 1);
  EXPECT_EQ(stem_def->knobs.at("vpt"), 2);

  OpCall wide = call_of({OpId::kMaxPool2d, {1, 1, 4, 200}, DType::kF32,
                         {{"kernel_size", {1, 8}}, {"stride", {1, 2}}, {"dilation", {1, 4}}}});
  auto too_wide = t->render(wide, {{"regs", 1}, {"vpt", 4}});   // 3 * 2 + 7 * 4 + 1 = 35 registers
  ASSERT_FALSE(too_wide.is_ok());
  EXPECT_EQ(too_wide.status().code(), Code::kUnsupported);
  EXPECT_TRUE(t->render(wide, {{"regs", 1}, {"vpt", 2}}).is_ok());

  // Vector-loaded spans: offered where the input row divides into vectors of up to 16 bytes (a
  // 2x2 stride-2 window, which has no span otherwise, too); only with a register span; refused
  // where a thread's first column is not vector-aligned; seeded in the first generation.
  OpCall v3 = call_of({OpId::kMaxPool3dValues, {8, 64, 16, 112, 112}, DType::kBF16, {{"kernel_size", 2}, {"stride", 2}}});
  std::map<std::string, std::vector<int64_t>> dims;
  for (const auto& d : t->space(v3)) dims[d.name] = d.values;
  EXPECT_EQ(dims["vl"], (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(dims["regs"], (std::vector<int64_t>{0, 1}));
  auto vec = t->render(v3, {{"regs", 1}, {"vpt", 4}, {"vl", 8}});
  ASSERT_TRUE(vec.is_ok()) << vec.status().to_string();
  EXPECT_NE(vec->source.find("constexpr int VL = 8,"), std::string::npos);
  EXPECT_EQ(t->render(v3, {{"regs", 0}, {"vl", 8}})->knobs.at("vl"), 1);
  auto odd = t->render(v3, {{"regs", 1}, {"vpt", 2}, {"vl", 8}});   // 2 outputs span 4 columns
  ASSERT_FALSE(odd.is_ok());
  EXPECT_EQ(odd.status().code(), Code::kUnsupported);
  auto seeds = t->seeds(v3);
  ASSERT_FALSE(seeds.empty());
  EXPECT_EQ(seeds[0].at("vl"), 8);
  EXPECT_EQ(seeds[0].at("vpt"), 4);
  // A dilated 1x8 window at stride 1 (max_pool1d through the 2d kernels): 8 outputs a thread read
  // 32 columns where 4 read 28, so the fewest-loads span is seeded as well (bf16: 8-byte vectors,
  // as 16-byte ones would start 4 columns early and overflow the registers).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    OpCall d1 = call_of({OpId::kMaxPool2d, {64, 192, 1, 16384}, dt,
                         {{"kernel_size", {1, 8}}, {"stride", {1, 1}}, {"padding", {0, 4}}, {"dilation", {1, 3}}}});
    auto s1d = t->seeds(d1);
    // One output row: no strips, so no seed without them; each span seed again with vector stores.
    ASSERT_EQ(s1d.size(), 4u) << dtype_name(dt);
    EXPECT_EQ(s1d[1].at("vpt"), 8);
    EXPECT_EQ(s1d[1].at("vl"), 4);
    EXPECT_TRUE(t->render(d1, s1d[1]).is_ok());
  }
  // 2x2 stride 2: 4 outputs in one 16-byte vector are already best; no strips; its copy with
  // vector stores is the second seed.
  EXPECT_EQ(t->seeds(v3).size(), 2u);
  OpCall narrow = call_of({OpId::kMaxPool2d, {1, 1, 5, 7}, DType::kF32, {{"kernel_size", 2}, {"stride", 2}}});
  for (const auto& d : t->space(narrow)) EXPECT_NE(d.name, "vl");   // 7 columns: no vector divides them
  EXPECT_TRUE(t->seeds(narrow).empty());

  OpCall ad = call_of({OpId::kAdaptiveAvgPool2d, {2, 3, 10, 7}, DType::kF32, {{"output_size", {3, 4}}}});
  for (const auto& d : t->space(ad)) EXPECT_TRUE(d.name != "bake" && d.name != "il" && d.name != "regs" && d.name != "rows") << d.name;
}

// Embedding backward's float atomics: offered for fp32 without scale_grad_by_freq only, seeded
// (the default stays the deterministic sort), two launches and no scratch, the sort's knobs fixed.
TEST(TemplatesCuda, EmbeddingBackwardAtomicsOnlyForFp32) {
  const json gpt2 = {{"num_weights", 50257}};
  OpCall f = call_of({OpId::kEmbeddingBackward, {8192, 768}, DType::kF32, gpt2});
  const Template* t = cuda_template_for(f);
  ASSERT_NE(t, nullptr);
  auto def = t->render(f, {});
  ASSERT_TRUE(def.is_ok());
  EXPECT_EQ(def->knobs.at("atomic"), 0);
  EXPECT_TRUE(def->repeatable);   // the sort sums every row in position order
  EXPECT_EQ(def->source.find("kc_vadd(orow"), std::string::npos);
  ASSERT_EQ(t->seeds(f).size(), 2u);   // vector atomics (sm_90's float4), then one an element
  auto at = t->render(f, t->seeds(f)[0]);
  ASSERT_TRUE(at.is_ok()) << at.status().to_string();
  EXPECT_NE(at->source.find("kc_vadd(orow"), std::string::npos);
  EXPECT_NE(at->source.find("constexpr bool VATOM = true;"), std::string::npos);
  EXPECT_FALSE(at->repeatable);   // declared: recorded "varies" whatever the gauntlet's runs show
  auto scalar = t->render(f, t->seeds(f)[1]);
  ASSERT_TRUE(scalar.is_ok());
  EXPECT_NE(scalar->source.find("constexpr bool VATOM = false;"), std::string::npos);
  EXPECT_EQ(at->launch["launches"].size(), 2u);
  EXPECT_FALSE(at->launch.contains("scratch"));
  EXPECT_EQ(scalar->id(), t->render(f, {{"atomic", 1}, {"chunk", 16}, {"sort_threads", 128}, {"items", 4}})->id());
  for (const auto& [dt, args] : std::vector<std::pair<DType, json>>{
           {DType::kBF16, gpt2}, {DType::kF16, gpt2}, {DType::kF32, {{"num_weights", 50257}, {"scale_grad_by_freq", true}}}}) {
    OpCall c = call_of({OpId::kEmbeddingBackward, {8192, 768}, dt, args});
    for (const auto& d : t->space(c)) EXPECT_NE(d.name, "atomic") << dtype_name(dt) << args.dump();
    EXPECT_TRUE(t->seeds(c).empty());
  }
}

// Layer norm in halves: 8 halves (16 bytes) a vector load where the row allows, statistics in
// fp32; fp32 renders keep their element type (no 16-bit wrapper); 8-wide column sums over 32 row
// groups would need 64 KiB of static shared memory and are refused.
TEST(TemplatesCuda, LayerNormHalvesLoadSixteenBytes) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    OpCall f = call_of({OpId::kLayerNorm, {64, 1024}, dt, json::object()});
    EXPECT_EQ(f.outputs[0].dtype, dt);
    EXPECT_EQ(f.outputs[1].dtype, DType::kF32);
    const Template* t = cuda_template_for(f);
    ASSERT_NE(t, nullptr);
    auto r = t->render(f, {});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->knobs.at("vec"), 8);
    EXPECT_NE(r->source.find("struct KcE"), std::string::npos);
    EXPECT_EQ(r->source.find("KC_ELEM"), std::string::npos);
    OpCall b = call_of({OpId::kLayerNormBackward, {64, 1024}, dt, json::object()});
    EXPECT_EQ(b.input("mean")->dtype, DType::kF32);
    EXPECT_EQ(b.outputs[1].dtype, dt);
    auto br = cuda_template_for(b)->render(b, {});
    ASSERT_TRUE(br.is_ok()) << br.status().to_string();
    EXPECT_EQ(br->knobs.at("vec"), 8);
    EXPECT_EQ(br->knobs.at("col_vec"), 8);
    EXPECT_EQ(cuda_template_for(b)->render(b, {{"col_ty", 32}, {"col_vec", 8}}).status().code(), Code::kUnsupported);
    OpCall odd = call_of({OpId::kLayerNorm, {3, 130}, dt, json::object()});   // 130 = 2 * 65: pairs at most
    auto o = cuda_template_for(odd)->render(odd, {});
    ASSERT_TRUE(o.is_ok()) << o.status().to_string();
    EXPECT_EQ(o->knobs.at("vec"), 2);
  }
  OpCall f32 = call_of({OpId::kLayerNorm, {64, 1024}, DType::kF32, json::object()});
  auto r = cuda_template_for(f32)->render(f32, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->source.find("KcE"), std::string::npos);
  EXPECT_EQ(r->knobs.at("vec"), 4);
}

// Cross-entropy: an LLM vocabulary in bf16 defaults to a block of 256 threads a row (512 for the
// backward) with four 16-byte loads in flight (two), 1000 classes to a warp a row; reduction none (and a 1-d self) is one launch without
// scratch, mean and sum add the fold; the backward needs its one-block prep only for a class
// mean or weighted smoothing; an absent weight is never named; a register-hungry unroll is
// kUnsupported; a grad in another dtype than the loss's stays eager's.
TEST(TemplatesCuda, CrossEntropyDefaultsAndLaunches) {
  OpCall llm = call_of({OpId::kCrossEntropy, {8192, 128256}, DType::kBF16, json::object()});
  const Template* t = cuda_template_for(llm);
  ASSERT_NE(t, nullptr);
  auto r = t->render(llm, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->knobs.at("threads"), 256);
  EXPECT_EQ(r->knobs.at("unroll"), 4);
  EXPECT_EQ(r->knobs.at("vec"), 8);
  OpCall llm_b = call_of({OpId::kCrossEntropyBackward, {8192, 128256}, DType::kBF16, json::object()});
  auto rb = cuda_template_for(llm_b)->render(llm_b, {});
  ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
  EXPECT_EQ(rb->knobs.at("threads"), 512);
  EXPECT_EQ(rb->knobs.at("unroll"), 2);
  EXPECT_EQ(r->launch["launches"].size(), 2u);
  EXPECT_TRUE(r->launch.contains("scratch"));
  EXPECT_EQ(r->launch.dump().find("ptr:weight"), std::string::npos);
  OpCall small = call_of({OpId::kCrossEntropy, {64, 1000}, DType::kF32, {{"reduction", 0}, {"weight", true}}});
  auto s = cuda_template_for(small)->render(small, {});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->knobs.at("threads"), 32);
  EXPECT_EQ(s->launch["launches"].size(), 1u);
  EXPECT_FALSE(s->launch.contains("scratch"));
  EXPECT_NE(s->launch.dump().find("ptr:weight"), std::string::npos);
  OpCall one = call_of({OpId::kCrossEntropy, {1000}, DType::kF32, {{"reduction", 1}}});
  EXPECT_EQ(cuda_template_for(one)->render(one, {})->launch["launches"].size(), 1u);
  // fp32 probabilities and weight beside bf16 logits: 4 vectors of 8 are 48 words a thread.
  OpCall up = call_of({OpId::kCrossEntropy, {64, 128256}, DType::kBF16, {{"probs", true}, {"weight", true}, {"upcast", true}}});
  EXPECT_EQ(cuda_template_for(up)->render(up, {{"threads", 1024}, {"unroll", 4}, {"vec", 8}}).status().code(),
            Code::kUnsupported);
  for (const auto& [args, prep] : std::vector<std::pair<json, bool>>{{{{"reduction", 1}}, true},
                                                                    {{{"reduction", 2}}, false},
                                                                    {{{"reduction", 2}, {"weight", true}, {"label_smoothing", 0.1}}, true},
                                                                    {{{"reduction", 1}, {"probs", true}}, false}}) {
    OpCall b = call_of({OpId::kCrossEntropyBackward, {64, 1000}, DType::kBF16, args});
    auto br = cuda_template_for(b)->render(b, {});
    ASSERT_TRUE(br.is_ok()) << args.dump() << ": " << br.status().to_string();
    EXPECT_EQ(br->launch["launches"].size(), prep ? 2u : 1u) << args.dump();
  }
  OpCall g32 = call_of({OpId::kCrossEntropyBackward, {64, 1000}, DType::kBF16, {{"reduction", 0}}});
  g32.inputs[0].dtype = DType::kF32;
  for (const Template* ct : cuda_templates()) EXPECT_TRUE(ct->space(g32).empty()) << ct->name();
}

// RMSNorm: an LLM hidden size in bf16 keeps the row in registers (128 threads a row, 16-byte
// vectors), 1024 fp32 columns take a warp a row, one 128256 row splits, odd columns fall back to
// narrower vectors; the backward's grad_weight sums over row ranges with a finishing launch, and
// a mask without grad_input has no row knobs; an absent weight is never named.
TEST(TemplatesCuda, RmsNormDefaultsAndLaunches) {
  OpCall h = call_of({OpId::kRmsNorm, {8192, 4096}, DType::kBF16, json::object()});
  const Template* t = cuda_template_for(h);
  ASSERT_NE(t, nullptr);
  auto r = t->render(h, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->knobs.at("threads"), 128);
  EXPECT_EQ(r->knobs.at("vec"), 8);
  EXPECT_EQ(r->knobs.at("regs"), 1);
  EXPECT_EQ(r->knobs.at("split"), 0);
  EXPECT_EQ(r->launch["launches"].size(), 1u);
  EXPECT_NE(r->launch.dump().find("ptr:weight"), std::string::npos);
  OpCall f = call_of({OpId::kRmsNorm, {8192, 1024}, DType::kF32, {{"weight", false}}});
  auto rf = cuda_template_for(f)->render(f, {});
  ASSERT_TRUE(rf.is_ok()) << rf.status().to_string();
  EXPECT_EQ(rf->knobs.at("threads"), 32);
  EXPECT_EQ(rf->knobs.at("vec"), 4);
  EXPECT_EQ(rf->launch.dump().find("ptr:weight"), std::string::npos);
  OpCall one = call_of({OpId::kRmsNorm, {1, 128256}, DType::kBF16, json::object()});
  auto ro = cuda_template_for(one)->render(one, {});
  ASSERT_TRUE(ro.is_ok()) << ro.status().to_string();
  EXPECT_GT(ro->knobs.at("split"), 0);
  EXPECT_EQ(ro->launch["launches"].size(), 2u);
  OpCall odd = call_of({OpId::kRmsNorm, {65, 77}, DType::kF16, json::object()});
  EXPECT_EQ(cuda_template_for(odd)->render(odd, {})->knobs.at("vec"), 1);
  OpCall b = call_of({OpId::kRmsNormBackward, {8192, 4096}, DType::kBF16, json::object()});
  auto rb = cuda_template_for(b)->render(b, {});
  ASSERT_TRUE(rb.is_ok()) << rb.status().to_string();
  EXPECT_EQ(rb->launch["launches"].size(), 3u);   // rows, column ranges, their sum
  EXPECT_GT(rb->knobs.at("col_split"), 1);
  OpCall bw = call_of({OpId::kRmsNormBackward, {64, 1000}, DType::kF32, {{"output_mask", {0, 1}}}});
  const Template* tb = cuda_template_for(bw);
  ASSERT_NE(tb, nullptr);
  for (const auto& d : tb->space(bw)) EXPECT_EQ(d.name.rfind("col_", 0), 0u) << d.name;
  OpCall bi = call_of({OpId::kRmsNormBackward, {64, 1000}, DType::kF32, {{"weight", false}}});
  auto rbi = cuda_template_for(bi)->render(bi, {});
  ASSERT_TRUE(rbi.is_ok()) << rbi.status().to_string();
  EXPECT_EQ(rbi->launch["launches"].size(), 1u);
}

// cuda.kl_div: KernelBench's (32768, 4096) batchmean (aten's sum) is a grid of about eight blocks
// an SM reading 16-byte vectors, then one block folding the partials (two launches, no atomics);
// a small call is one launch; reduction none and the backward are one elementwise pass.
TEST(TemplatesCuda, KlDivDefaultsAndLaunches) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    OpCall big = call_of({OpId::kKlDiv, {32768, 4096}, dt, {{"reduction", 2}}});
    const Template* t = cuda_template_for(big);
    ASSERT_NE(t, nullptr);
    auto r = t->render(big, {});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->knobs.at("vec"), dt == DType::kF32 ? 4 : 8);
    EXPECT_EQ(r->knobs.at("blocks"), 1056);
    EXPECT_EQ(r->launch["launches"].size(), 2u);
    EXPECT_NE(r->launch.dump().find("kc_kl_final"), std::string::npos);
  }
  OpCall small = call_of({OpId::kKlDiv, {37, 100}, DType::kF32, {{"reduction", 1}, {"log_target", true}}});
  auto rs = cuda_template_for(small)->render(small, {});
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  EXPECT_EQ(rs->knobs.at("blocks"), 1);
  EXPECT_EQ(rs->launch["launches"].size(), 1u);
  EXPECT_NE(rs->source.find("LOG_T = true"), std::string::npos);
  for (OpId op : {OpId::kKlDiv, OpId::kKlDivBackward}) {
    OpCall none = call_of({op, {64, 1000}, DType::kBF16, {{"reduction", 0}}});
    auto rn = cuda_template_for(none)->render(none, {});
    ASSERT_TRUE(rn.is_ok()) << rn.status().to_string();
    EXPECT_EQ(rn->launch["launches"].size(), 1u);
    EXPECT_EQ(rn->knobs.count("blocks"), 0u);
  }
}

// cuda.unary: fast math is offered, and first, only for 16-bit data and only for ops with a fast
// body; fp32 renders never carry an approximate intrinsic, and the precise 16-bit body stays
// reachable.
TEST(TemplatesCuda, FastMathOnlyForHalves) {
  auto knob_values = [](const Template* t, const OpCall& c) {
    for (const auto& d : t->space(c))
      if (d.name == "math") return d.values;
    return std::vector<int64_t>{};
  };
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    OpCall c = call_of({OpId::kSoftplus, {4096}, dt, json::object()});
    const Template* t = cuda_template_for(c);
    ASSERT_NE(t, nullptr);
    auto def = t->render(c, {});
    ASSERT_TRUE(def.is_ok()) << def.status().to_string();
    const bool half = dt != DType::kF32;
    EXPECT_EQ(knob_values(t, c), half ? std::vector<int64_t>({1, 0}) : std::vector<int64_t>{});
    EXPECT_EQ(def->source.find("__expf") != std::string::npos, half) << dtype_name(dt);
    if (!half) continue;
    auto precise = t->render(c, {{"math", 0}});
    ASSERT_TRUE(precise.is_ok());
    for (const char* fast : {"__expf", "__logf", "__fdividef"}) EXPECT_EQ(precise->source.find(fast), std::string::npos);
    EXPECT_NE(precise->source.find("log1pf(expf("), std::string::npos);
  }
  OpCall relu = call_of({OpId::kRelu, {4096}, DType::kBF16, json::object()});
  EXPECT_TRUE(knob_values(cuda_template_for(relu), relu).empty()) << "no transcendental, no fast body";
  OpCall gelu_bwd = call_of({OpId::kGeluBackward, {4096}, DType::kBF16, json::object()});
  EXPECT_TRUE(knob_values(cuda_template_for(gelu_bwd), gelu_bwd).empty()) << "erf gelu's backward keeps erff";
  // Softmax's exp and division: fast by default in 16 bits, never offered in fp32 or backward.
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax, OpId::kSoftmaxBackward})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      OpCall c = call_of({op, {64, 1024}, dt, json::object()});
      const Template* t = cuda_template_for(c);
      ASSERT_NE(t, nullptr);
      const bool offered = dt != DType::kF32 && op != OpId::kSoftmaxBackward;
      EXPECT_EQ(knob_values(t, c), offered ? std::vector<int64_t>({1, 0}) : std::vector<int64_t>{}) << op_info(op).name;
      auto def = t->render(c, {});
      ASSERT_TRUE(def.is_ok()) << def.status().to_string();
      EXPECT_EQ(def->source.find("__expf") != std::string::npos, offered) << op_info(op).name << " " << dtype_name(dt);
      if (!offered) continue;
      auto precise = t->render(c, {{"math", 0}});
      ASSERT_TRUE(precise.is_ok());
      for (const char* fast : {"__expf", "__fdividef"}) EXPECT_EQ(precise->source.find(fast), std::string::npos);
    }
}

// cuda.reduction over a middle dim (columns): about 16 bytes of loads a lane in flight, so 8 rows
// a thread for single 16-bit columns and for indexed states, 4 for fp32 sums.
TEST(TemplatesCuda, ReductionColumnsKeepSixteenBytesInFlight) {
  const std::tuple<OpId, DType, int64_t> want[] = {{OpId::kSum, DType::kBF16, 8}, {OpId::kVar, DType::kF16, 8},
                                                   {OpId::kSum, DType::kF32, 4}, {OpId::kArgmax, DType::kF32, 8}};
  for (const auto& [op, dt, unroll] : want) {
    OpCall c = call_of({op, {16, 4096, 1023}, dt, {{"dim", 1}}});
    const Template* t = cuda_template_for(c);
    ASSERT_NE(t, nullptr);
    auto def = t->render(c, {});
    ASSERT_TRUE(def.is_ok()) << def.status().to_string();
    EXPECT_EQ(def->knobs.at("unroll"), unroll) << op_info(op).name << " " << dtype_name(dt);
  }
}

}  // namespace
}  // namespace kc::evolve
