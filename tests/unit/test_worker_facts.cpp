// What a promoted record keeps from its full-gauntlet verdict as typed fields (evolve/worker/worker.h
// record_verdict_facts): the numerics stage's determinism and the live check's budget per output.
#include <gtest/gtest.h>

#include "evolve/worker/worker.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

json verdict(bool bitwise) {
  json sets = json::array({
      {{"set", "normal"}, {"outputs", {{{"budget", 1e-6}, {"eager_error", 2e-7}}, {{"budget", 4e-6}, {"eager_error", 0.0}}}}},
      {{"set", "large"}, {"outputs", {{{"budget", 3e-6}, {"eager_error", 1e-6}}, {{"budget", 1e-6}, {"eager_error", 0.0}}}}},
  });
  return {{"verified", true},
          {"stages", {{{"name", "static"}, {"outcome", "passed"}, {"evidence", json::object()}},
                      {{"name", "numerics"}, {"outcome", "passed"},
                       {"evidence", {{"bitwise_deterministic", bitwise}, {"sets", sets}}}}}}};
}

TEST(RecordVerdictFacts, DeterminismAndBudgetReachTheRecord) {
  Record r;
  record_verdict_facts(r, verdict(true));
  EXPECT_EQ(r.determinism, Determinism::kBitwise);
  ASSERT_EQ(r.budget.size(), 2u);
  EXPECT_DOUBLE_EQ(r.budget[0], 2 * (3e-6 + 1e-6));   // the largest over the sets, doubled
  EXPECT_DOUBLE_EQ(r.budget[1], 2 * 4e-6);
  Record v;
  record_verdict_facts(v, verdict(false));
  EXPECT_EQ(v.determinism, Determinism::kVaries);
}

// A candidate its template declares not repeatable (float atomics) is recorded "varies" even where
// the gauntlet's two runs agreed bit for bit, and with no numerics evidence at all.
TEST(RecordVerdictFacts, ADeclaredNonRepeatableCandidateVaries) {
  Record r;
  record_verdict_facts(r, verdict(true), false);
  EXPECT_EQ(r.determinism, Determinism::kVaries);
  ASSERT_EQ(r.budget.size(), 2u);   // the budgets still reach the record
  Record e;
  record_verdict_facts(e, {{"verified", false}, {"stages", json::array()}}, false);
  EXPECT_EQ(e.determinism, Determinism::kVaries);
}

TEST(RecordVerdictFacts, NoNumericsEvidenceLeavesTheRecordAlone) {
  Record r;
  record_verdict_facts(r, {{"verified", false}, {"stages", json::array()}});
  EXPECT_EQ(r.determinism, Determinism::kUnknown);
  EXPECT_TRUE(r.budget.empty());
  json rejected = verdict(true);
  rejected["stages"][1]["outcome"] = "rejected";
  record_verdict_facts(r, rejected);
  EXPECT_EQ(r.determinism, Determinism::kUnknown);
}

TEST(IsRecordedKernel, TheDisabledKernelIsRecognisedWhateverTheSpecsSpelling) {
  const std::string src = "extern \"C\" void k(const kc_cpu_ctx*, void* const*) {}\n";
  const json launch = {{"version", 1},
                       {"launches", {{{"entry", "k"}, {"grid", {"ceil_div(numel(self), 256)", 1, 1}}, {"block", {256, 1, 1}},
                                      {"args", {"ptr:out0", "ptr:self"}}}}}};
  auto spec = parse_launch_spec(launch);
  ASSERT_TRUE(spec) << spec.status().to_string();
  Record r;
  r.source = src;
  r.launch = to_json(spec.value());   // as make_manual_record stores it
  EXPECT_TRUE(is_recorded_kernel(r, src, launch));
  EXPECT_FALSE(is_recorded_kernel(r, src + " ", launch));
  json other = launch;
  other["launches"][0]["block"] = {128, 1, 1};
  EXPECT_FALSE(is_recorded_kernel(r, src, other));
}

}  // namespace
}  // namespace kc::evolve
