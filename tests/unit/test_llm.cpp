// The LLM proposer's torch-free parts: what the model is told, how its reply is read, and how its
// kernels live in the search state (they cannot be re-rendered, so the state keeps their text).
#include <gtest/gtest.h>

#include "evolve/propose/llm.h"
#include "evolve/search/search.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

OpCall relu_call(BackendKind backend) {
  auto c = make_call(OpId::kRelu, {300, 7}, DType::kF32, backend);
  EXPECT_TRUE(c) << c.status().to_string();
  return c.value();
}

std::string chat_body(const std::string& content) {
  return json{{"choices", json::array({{{"message", {{"role", "assistant"}, {"content", content}}}}})}}.dump();
}

TEST(Llm, MessagesCarryTheCallTheRulesAndTheFeedback) {
  OpCall c = relu_call(BackendKind::kCpu);
  LlmContext ctx;
  ctx.eager_ms = 0.012;
  ctx.best.push_back({"cpu.unary{elems=4096}", "extern \"C\" void kc_best(...) {}", {{"version", 1}}, 0.010,
                      {{"kc_best", {{"registers", 32}}}}});
  ctx.best.push_back({"cpu.unary{elems=1024}", "extern \"C\" void kc_second(...) {}", {{"version", 1}}, 0.011, {}});
  ctx.failures = {"cpu.unary{elems=64}: rejected at stage sanitizer: heap-buffer-overflow"};
  ctx.last_rejection = "rejected at stage numerics: index 17";
  json m = llm_messages(c, ctx);
  ASSERT_EQ(m.size(), 2u);
  const std::string system = m[0]["content"], task = m[1]["content"];
  EXPECT_NE(system.find("kc_cpu_ctx"), std::string::npos) << "CPU rules name the CPU ABI";
  EXPECT_NE(system.find("launch spec"), std::string::npos);
  EXPECT_NE(task.find("aten::relu"), std::string::npos);
  EXPECT_NE(task.find("[300,7]"), std::string::npos) << "the call's sizes are in the task: " << task;
  EXPECT_NE(task.find("kc_best"), std::string::npos) << "the fastest kernels so far are shown";
  EXPECT_NE(task.find("kc_second"), std::string::npos);
  EXPECT_NE(task.find("\"registers\":32"), std::string::npos) << "with their resource use";
  // 300x7 floats in and out: 16,800 bytes; in 10 us that is 1.68 GB/s.
  EXPECT_NE(task.find("10.00 us (1.7 GB/s over the 16800 bytes"), std::string::npos) << task;
  EXPECT_NE(task.find("heap-buffer-overflow"), std::string::npos) << "recent failures are fed back";
  EXPECT_NE(task.find("index 17"), std::string::npos) << "its own last rejection is fed back";
  EXPECT_NE(llm_messages(relu_call(BackendKind::kCuda), {})[0]["content"].get<std::string>().find("NVRTC"), std::string::npos);
}

TEST(Llm, RequestsForEitherApi) {
  LlmOptions o;
  o.model = "m";
  json openai = llm_request(o, relu_call(BackendKind::kCpu), {});
  EXPECT_EQ(openai["model"], "m");
  ASSERT_EQ(openai["messages"].size(), 2u);
  EXPECT_EQ(openai["messages"][0]["role"], "system");
  o.api = "anthropic";
  json anthropic = llm_request(o, relu_call(BackendKind::kCpu), {});
  EXPECT_TRUE(anthropic["system"].is_string()) << "Anthropic takes the rules as a top-level system prompt";
  ASSERT_EQ(anthropic["messages"].size(), 1u);
  EXPECT_EQ(anthropic["messages"][0]["role"], "user");
  EXPECT_GT(anthropic["max_tokens"].get<int>(), 0);
}

TEST(Llm, RepliesAreReadFencedOrBare) {
  const json launch = {{"version", 1}, {"launches", json::array()}};
  const std::string obj = json{{"source", "int x;"}, {"launch", launch}}.dump();
  for (const std::string& content : {obj, "Here you go:\n```json\n" + obj + "\n```\nEnjoy.", "  " + obj + "\n"}) {
    auto p = parse_llm_reply(chat_body(content));
    ASSERT_TRUE(p) << content << ": " << p.status().to_string();
    EXPECT_EQ(p.value().source, "int x;");
    EXPECT_EQ(p.value().launch, launch);
  }
  // Anthropic's Messages API: text blocks in "content".
  json msg = {{"type", "message"}, {"content", json::array({{{"type", "text"}, {"text", "```json\n" + obj + "\n```"}}})}};
  auto p = parse_llm_reply(msg.dump(), "anthropic");
  ASSERT_TRUE(p) << p.status().to_string();
  EXPECT_EQ(p.value().source, "int x;");
  EXPECT_FALSE(parse_llm_reply(chat_body(obj), "anthropic")) << "an OpenAI body is not an Anthropic one";
}

TEST(Llm, BadRepliesAreErrorsWithAReason) {
  const std::pair<std::string, const char*> bad[] = {
      {"not json", "not JSON"},
      {json{{"error", {{"message", "quota"}}}}.dump(), "error"},
      {json{{"choices", json::array()}}.dump(), "no choices"},
      {chat_body("I cannot help with that."), "no JSON object"},
      {chat_body("{\"source\": 3, \"launch\": {}}"), "source"},
      {chat_body("{\"source\": \"x\"}"), "launch"},
      {chat_body("{\"source\": \"x\", \"launch\": {"), "no JSON object"},
  };
  for (const auto& [body, why] : bad) {
    auto p = parse_llm_reply(body);
    ASSERT_FALSE(p) << body;
    EXPECT_NE(p.status().message().find(why), std::string::npos) << p.status().message();
  }
}

TEST(Llm, ProposalsJoinTheBatchAndSurviveAResume) {
  OpCall c = relu_call(BackendKind::kCpu);
  c.key = "kc1|cpu-test|aten::relu|fp32|test";
  EXPECT_FALSE(Search(c, SearchOptions{}).freeform_due()) << "generation 0 is the templates' own";
  SearchState second;
  second.generation = 1;
  Search s(c, SearchOptions{}, second);
  ASSERT_FALSE(s.next_batch().empty());
  ASSERT_TRUE(s.freeform_due());
  s.freeform_asked();
  EXPECT_FALSE(s.freeform_due()) << "once per generation";
  const LlmProposer llm(LlmOptions{});
  const json launch = {{"version", 1}};
  auto a = s.add_proposal(llm, {"extern \"C\" void a() {}", launch, {"parent-id"}});
  ASSERT_TRUE(a) << a.status().to_string();
  EXPECT_EQ(a.value().family, "llm");
  EXPECT_EQ(a.value().origin, "llm");
  EXPECT_FALSE(s.add_proposal(llm, {"extern \"C\" void a() {}", launch, {}})) << "the same kernel twice is refused";
  // A worker killed now resumes with the proposal still pending, its text intact.
  SearchState saved = search_state_from(to_json(s.state()));
  ASSERT_EQ(saved.proposals.size(), 1u);
  EXPECT_EQ(saved.freeform_generation, 1);
  EXPECT_EQ(saved.proposals[0]["family"], "llm");
  Search resumed(c, SearchOptions{}, saved);
  bool found = false;
  for (const Candidate& k : resumed.next_batch())
    if (k.family == "llm") {
      found = true;
      EXPECT_EQ(k.source, "extern \"C\" void a() {}");
      EXPECT_EQ(k.parents, std::vector<std::string>{"parent-id"});
    }
  EXPECT_TRUE(found) << "the pending LLM candidate comes back after a resume";
  EXPECT_FALSE(resumed.render("llm", {{"n", 5}})) << "an index past the proposals is an error";
  EXPECT_FALSE(resumed.render("other", {{"n", 0}})) << "a proposal is rendered only as its own proposer's";
}

TEST(Llm, AStateWrittenBeforeProposersWereNamedResumes) {
  json old = {{"generation", 2}, {"llm_generation", 1},
              {"proposals", {{{"source", "extern \"C\" void b() {}"}, {"launch", {{"version", 1}}}, {"parents", json::array()}}}}};
  SearchState s = search_state_from(old);
  EXPECT_EQ(s.freeform_generation, 1);
  ASSERT_EQ(s.proposals.size(), 1u);
  OpCall c = relu_call(BackendKind::kCpu);
  c.key = "kc1|cpu-test|aten::relu|fp32|test";
  auto k = Search(c, SearchOptions{}, s).render("llm", {{"n", 0}});
  ASSERT_TRUE(k) << k.status().to_string();
  EXPECT_EQ(k.value().source, "extern \"C\" void b() {}");
}

TEST(Llm, WithoutAnEndpointNothingIsAsked) {
  LlmOptions o;
  EXPECT_FALSE(o.enabled());
  auto p = ask_llm(o, relu_call(BackendKind::kCpu), {});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.status().code(), Code::kUnsupported);
}

}  // namespace
}  // namespace kc::evolve
