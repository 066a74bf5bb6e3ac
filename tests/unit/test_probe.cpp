// The serve probe's decision (dispatcher/probe.h): which timed pairs keep a served kernel.
#include "dispatcher/probe.h"

#include <gtest/gtest.h>

#include <vector>

namespace kc::dispatch {
namespace {

// `n` counted pairs after the warm-up, alternating eager first / served first as call.cpp does;
// the kernel takes `first_ms` when it runs first and `second_ms` when it runs second, eager 1 ms
// whenever it runs.
std::vector<ProbeSample> alternating(int n, double first_ms, double second_ms) {
  std::vector<ProbeSample> s{{50.0, 50.0, true}};   // the warm-up: first-call costs, never counted
  for (int i = 0; i < n; ++i) {
    const bool served_first = i % 2 == 1;
    s.push_back({served_first ? first_ms : second_ms, 1.0, served_first});
  }
  return s;
}

TEST(Probe, AKernelFasterInBothOrdersIsKept) {
  ProbeVerdict v = judge_probe(alternating(8, 0.8, 0.7));
  EXPECT_TRUE(v.done);
  EXPECT_TRUE(v.keep);
  EXPECT_EQ(v.pairs, 8u);
  EXPECT_GT(v.speedup, 1.25);
  EXPECT_LT(v.speedup, 1.43);
}

TEST(Probe, AKernelFasterOnlyWhenItFindsWarmInputsIsDemoted) {
  // Second on warm inputs it wins by 1.3x, first on cold ones it loses (1/1.25): the median of all
  // eight ratios would be above 1, but it is slower than eager whenever both start cold.
  ProbeVerdict v = judge_probe(alternating(8, 1.25, 1.0 / 1.3));
  EXPECT_TRUE(v.done);
  EXPECT_FALSE(v.keep);
  EXPECT_GT(v.speedup, 1.0);   // the order-fair estimate alone would not have caught it
}

TEST(Probe, ATieIsDemoted) {
  EXPECT_FALSE(judge_probe(alternating(8, 1.0, 1.0)).keep);
  EXPECT_FALSE(judge_probe(alternating(8, 1.2, 1.2)).keep);
}

TEST(Probe, OneOrderOnlyIsJudgedOnThatOrder) {
  std::vector<ProbeSample> s{{9.0, 9.0, false}, {0.5, 1.0, false}, {0.6, 1.0, false}, {0.5, 1.0, false}};
  ProbeVerdict v = judge_probe(s);
  EXPECT_TRUE(v.keep);
  EXPECT_NEAR(v.speedup, 2.0, 1e-9);
  s.push_back({3.0, 1.0, true});   // one cold loss is the whole served-first order: demoted
  EXPECT_FALSE(judge_probe(s).keep);
}

TEST(Probe, TheWarmUpAloneKeepsWhatTheGauntletPromoted) {
  ProbeVerdict v = judge_probe({{100.0, 1.0, true}});
  EXPECT_TRUE(v.done);
  EXPECT_TRUE(v.keep);
  EXPECT_EQ(v.pairs, 0u);
}

TEST(Probe, ExactlyTheLastArmedPairDecides) {
  ServeProbe p;
  arm_probe(p, 4);   // four counted pairs and the warm-up
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(add_probe_pair(p, {2.0, 1.0, i % 2 == 0}).done) << i;
  ProbeVerdict v = add_probe_pair(p, {2.0, 1.0, false});
  EXPECT_TRUE(v.done);
  EXPECT_FALSE(v.keep);
  EXPECT_EQ(v.pairs, 4u);
  EXPECT_FALSE(add_probe_pair(p, {0.1, 1.0, true}).done);   // past the end: ignored
  arm_probe(p, 0);
  EXPECT_FALSE(add_probe_pair(p, {0.1, 1.0, true}).done);   // probe off
}

}  // namespace
}  // namespace kc::dispatch
