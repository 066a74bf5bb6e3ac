// The (mu+lambda) search (evolve/search/search.h) with a scripted evaluator: no duplicates, mutation and
// crossover after the seeds, stagnation stops it, and a search resumed from its saved state
// repeats nothing.
#include <gtest/gtest.h>

#include <set>

#include "evolve/search/search.h"

namespace kc::evolve {
namespace {

OpCall relu_call() {
  auto c = make_call(OpId::kRelu, {1000, 37}, DType::kF32, BackendKind::kCpu);
  EXPECT_TRUE(c.is_ok());
  c.value().key = "kc1|test|aten::relu|fp32|self=T:f32[1000,37]s[37,1]a16";
  return c.value();
}

// A deterministic "time" per variant: faster with bigger knob values, so the search has a gradient.
double fake_ms(const Candidate& c) {
  double t = 10;
  for (const auto& [k, v] : c.knobs) t -= 0.001 * static_cast<double>(v % 97);
  return t;
}

Evaluation evaluate(const Candidate& c) {
  Evaluation e;
  e.id = c.id();
  e.family = c.family;
  e.knobs = c.knobs;
  e.parents = c.parents;
  e.origin = c.origin;
  e.verdict = "passed";
  e.median_ms = fake_ms(c);
  return e;
}

// Runs `gens` generations (or to the end) and returns the search.
void run(Search& s, int gens) {
  for (int g = 0; g < gens && !s.state().finished; ++g) {
    auto batch = s.next_batch();
    if (batch.empty()) break;
    for (const auto& c : batch) s.report(evaluate(c));
    s.end_generation(20.0);
  }
}

TEST(Search, SeedsThenChildrenNeverTwice) {
  SearchOptions o;
  o.max_generations = 5;
  o.patience = 5;
  Search s(relu_call(), o);
  run(s, 5);
  std::set<std::string> ids;
  bool mutated = false;
  for (const auto& e : s.state().tried) {
    EXPECT_TRUE(ids.insert(e.id).second) << "proposed twice: " << e.id;
    if (e.origin == "mutation" || e.origin == "crossover") {
      mutated = true;
      EXPECT_FALSE(e.parents.empty());
      EXPECT_GE(e.generation, 1);
    }
  }
  EXPECT_TRUE(mutated);
  EXPECT_GT(s.state().tried.size(), static_cast<size_t>(o.lambda));
  ASSERT_FALSE(s.ranked().empty());
  EXPECT_LE(s.ranked().front()->median_ms, s.ranked().back()->median_ms);
}

TEST(Search, StopsOnStagnation) {
  SearchOptions o;
  o.max_generations = 50;
  o.patience = 2;
  Search s(relu_call(), o);
  // Every candidate takes the same time: no generation improves on the first.
  for (int g = 0; g < 50 && !s.state().finished; ++g) {
    auto batch = s.next_batch();
    if (batch.empty()) break;
    for (const auto& c : batch) {
      Evaluation e = evaluate(c);
      e.median_ms = 5;
      s.report(e);
    }
    s.end_generation(20.0);
  }
  EXPECT_TRUE(s.state().finished);
  EXPECT_EQ(s.state().finish_reason, "stagnation");
  EXPECT_EQ(s.state().generation, 3);
}

// Slow candidates (256 MiB keys take seconds each) end the search inside its first generation once
// the budget is spent and something passed; before that nothing stops it.
TEST(Search, StopsWithinAGenerationWhenItsTimeIsSpent) {
  SearchOptions o;
  o.key_budget_s = 10;
  Search s(relu_call(), o);
  auto batch = s.next_batch();
  ASSERT_GT(batch.size(), 3u);
  Evaluation rejected = evaluate(batch[0]);
  rejected.verdict = "rejected";
  s.report(rejected);
  s.add_elapsed(12);
  EXPECT_FALSE(s.stop_if_out_of_time()) << "nothing has passed yet";
  s.report(evaluate(batch[1]));
  s.add_elapsed(4);
  EXPECT_TRUE(s.stop_if_out_of_time());
  EXPECT_TRUE(s.state().finished);
  EXPECT_EQ(s.state().finish_reason, "per-key time budget");
  EXPECT_TRUE(s.state().pending.empty());
  EXPECT_TRUE(s.next_batch().empty());
  EXPECT_EQ(s.state().tried.size(), 2u);
}

// Time to the first verified candidate and to the best: from when each evaluation was decided,
// kept through the saved state.
TEST(Search, RecordsTimeToFirstVerifiedAndToBest) {
  Search s(relu_call(), SearchOptions{});
  auto batch = s.next_batch();
  ASSERT_GT(batch.size(), 3u);
  EXPECT_EQ(s.first_verified_s(), 0);
  const double ms[] = {0, 9, 7, 8};   // 0: rejected
  for (int i = 0; i < 4; ++i) {
    Evaluation e = evaluate(batch[i]);
    if (ms[i] == 0) e.verdict = "rejected";
    e.median_ms = ms[i];
    e.at_s = 1.5 * (i + 1);
    s.report(e);
  }
  EXPECT_DOUBLE_EQ(s.first_verified_s(), 3.0);
  EXPECT_DOUBLE_EQ(s.best_found_s(), 4.5);
  Search back(relu_call(), SearchOptions{}, search_state_from(to_json(s.state())));
  EXPECT_DOUBLE_EQ(back.best_found_s(), 4.5);
}

TEST(Search, ResumesFromSavedStateWithoutRepeating) {
  SearchOptions o;
  o.max_generations = 4;
  o.patience = 4;
  Search a(relu_call(), o);
  run(a, 1);
  // Interrupted mid-generation: half of the next batch evaluated, then "killed".
  auto batch = a.next_batch();
  ASSERT_GE(batch.size(), 2u);
  for (size_t k = 0; k < batch.size() / 2; ++k) a.report(evaluate(batch[k]));
  const nlohmann::json saved = to_json(a.state());

  Search b(relu_call(), o, search_state_from(saved));
  EXPECT_EQ(b.state().tried.size(), a.state().tried.size());
  auto rest = b.next_batch();   // the pending half comes back first, and only it
  EXPECT_EQ(rest.size(), batch.size() - batch.size() / 2);
  for (const auto& c : rest) b.report(evaluate(c));
  b.end_generation(20.0);
  run(b, 10);
  std::set<std::string> ids;
  for (const auto& e : b.state().tried) EXPECT_TRUE(ids.insert(e.id).second) << "repeated after resume: " << e.id;
}

TEST(Search, FirstGenerationHasTheTemplatesSeedsAfterItsDefaults) {
  // cuda.batch_norm seeds the fused launch at one 1024-thread block per SM (templates_cuda_batch_norm.cpp).
  auto c = make_call(OpId::kBatchNorm, {1, 1024, 256, 256}, DType::kF32, BackendKind::kCuda,
                     {{"training", true}, {"running", false}, {"affine", false}});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  c.value().key = "kc1|test|aten::native_batch_norm|in";
  SearchOptions o;
  o.lambda = 3;
  Search s(c.value(), o);
  auto batch = s.next_batch();
  ASSERT_GE(batch.size(), 2u);
  EXPECT_EQ(batch[1].knobs.at("threads"), 1024);
  EXPECT_EQ(batch[1].knobs.at("resident"), 1);
  EXPECT_EQ(batch[1].knobs.at("fuse"), batch[0].knobs.at("fuse")) << "the seed's other knobs are the defaults";
}

TEST(Search, NoTemplateFinishesAtOnce) {
  auto c = make_call(OpId::kRelu, {8, 8}, DType::kI64, BackendKind::kCpu);   // no template handles int64
  ASSERT_TRUE(c.is_ok());
  Search s(c.value(), SearchOptions{});
  EXPECT_TRUE(s.next_batch().empty());
  EXPECT_TRUE(s.state().finished);
  EXPECT_EQ(s.state().finish_reason, "no template handles this call");
}

TEST(Search, OptionsRoundTripAndClamp) {
  SearchOptions o = search_options_from({{"mu", 0}, {"lambda", 3}, {"max_generations", 2}}).value();
  EXPECT_EQ(o.mu, 1);
  EXPECT_EQ(o.lambda, 3);
  SearchOptions p = search_options_from(to_json(o)).value();
  EXPECT_FALSE(search_options_from({{"mu", "4"}}).is_ok());
  EXPECT_FALSE(search_options_from({{"lambda", 1e12}}).is_ok());
  EXPECT_FALSE(search_options_from({{"key_budget_s", -1}}).is_ok());
  EXPECT_EQ(p.lambda, 3);
  EXPECT_EQ(p.max_generations, 2);
}

}  // namespace
}  // namespace kc::evolve
