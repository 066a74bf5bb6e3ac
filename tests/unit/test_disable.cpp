// The typed facts a record carries for serving (determinism, the live check's budget) and disabling
// a stored record on field evidence (kernel_cache/disable.h).
#include <gtest/gtest.h>

#include "kernel_cache/disable.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/store.h"
#include "test_util.h"

namespace kc {
namespace {

using nlohmann::json;

Record served(const std::string& key, const std::string& blob) {
  Record r;
  r.key = key;
  r.op = "aten::relu";
  r.backend = BackendKind::kCpu;
  r.source = "extern \"C\" void k(const kc_cpu_ctx*, void* const*) {}\n";
  r.launch = {{"version", 1}};
  r.meta = {{"provenance", {{"by", "test"}, {"verified", true}}}};
  r.blob = blob;
  return r;
}

Record stored(const std::string& dir, const std::string& key) {
  auto st = Store::open(dir, Store::Mode::kReadOnly);
  EXPECT_TRUE(st) << st.status().to_string();
  auto bytes = st.value()->get(key);
  EXPECT_TRUE(bytes) << bytes.status().to_string();
  auto r = decode_record(bytes.value());
  EXPECT_TRUE(r) << r.status().to_string();
  return r.value();
}

TEST(RecordFacts, DeterminismAndBudgetRoundTrip) {
  Record r = served("kc1|k", "bin");
  r.determinism = Determinism::kVaries;
  r.budget = {1e-6, 0.5};
  auto back = decode_record(encode_record(r));
  ASSERT_TRUE(back) << back.status().to_string();
  EXPECT_EQ(back->determinism, Determinism::kVaries);
  EXPECT_EQ(back->budget, r.budget);
  EXPECT_EQ(record_summary(back.value())["determinism"], "varies");
}

TEST(RecordFacts, RecordsWithoutTheFieldsReadAsUnknown) {
  // A record written before the fields existed: same format version, no determinism, no budget.
  json j = json::from_cbor(encode_record(served("kc1|k", "bin")));
  j.erase("determinism");
  j.erase("budget");
  std::string bytes;
  json::to_cbor(j, bytes);
  auto r = decode_record(bytes);
  ASSERT_TRUE(r) << r.status().to_string();
  EXPECT_EQ(r->determinism, Determinism::kUnknown);
  EXPECT_TRUE(r->budget.empty());
}

TEST(RecordFacts, WrongValuesAreCorrupt) {
  for (const json& bad : {json{{"determinism", "mostly"}}, json{{"determinism", 1}}, json{{"budget", "small"}},
                          json{{"budget", {1e-6, -1.0}}}}) {
    json j = json::from_cbor(encode_record(served("kc1|k", "bin")));
    j.update(bad);
    std::string bytes;
    json::to_cbor(j, bytes);
    auto r = decode_record(bytes);
    ASSERT_FALSE(r) << bad.dump();
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << bad.dump();
  }
}

TEST(RecordFacts, LiveBudgetHasAFloorAndAFallback) {
  Record r = served("kc1|k", "bin");
  EXPECT_DOUBLE_EQ(live_budget(r, 0, DType::kF32), budget_fallback(DType::kF32));
  r.budget = {0.0, 3e-3};
  EXPECT_GT(live_budget(r, 0, DType::kF32), 1e-6);          // 16 x fp32 roundoff, never 0
  EXPECT_LT(live_budget(r, 0, DType::kF32), 1e-5);
  EXPECT_DOUBLE_EQ(live_budget(r, 1, DType::kF32), 3e-3);   // the measured budget when larger
  EXPECT_DOUBLE_EQ(live_budget(r, 2, DType::kF32), budget_fallback(DType::kF32));   // not measured
  EXPECT_EQ(live_budget(r, 0, DType::kI64), 0.0);            // integers: exact
}

TEST(DisableStored, ServedRecordBecomesDisabledWithEvidenceAndKernel) {
  test::TempDir dir;
  Record r = served("kc1|cpu|aten::relu|fp32|self=T:f32[8]s[1]a16", std::string("\x7f" "ELF\0\x01", 6));
  ASSERT_TRUE(put_record(dir.path, r));
  const json evidence = {{"by", "live check"}, {"outputs", {{"error", 0.7}}}};
  ASSERT_TRUE(disable_stored(dir.path, r, evidence));
  Record d = stored(dir.path, r.key);
  EXPECT_EQ(d.state, RecordState::kDisabled);
  EXPECT_EQ(d.meta["disabled"], evidence);
  EXPECT_TRUE(same_kernel(d, r)) << "the disabled kernel is kept, so it is never stored again by mistake";
  EXPECT_TRUE(disable_stored(dir.path, r, {{"by", "again"}})) << "disabling twice is fine";
  EXPECT_EQ(stored(dir.path, r.key).meta["disabled"], evidence) << "the first evidence stays";
}

TEST(DisableStored, AReplacedKernelIsLeftAlone) {
  test::TempDir dir;
  Record checked = served("kc1|cpu|aten::relu|fp32|self=T:f32[9]s[1]a16", "old binary");
  Record now = served(checked.key, "new binary");
  ASSERT_TRUE(put_record(dir.path, now));
  Status s = disable_stored(dir.path, checked, {{"by", "live check"}});
  EXPECT_EQ(s.code(), Code::kNotFound) << s.to_string();
  EXPECT_EQ(stored(dir.path, checked.key).state, RecordState::kServed);
  Record gone = served("kc1|cpu|aten::relu|fp32|self=T:f32[10]s[1]a16", "x");
  EXPECT_EQ(disable_stored(dir.path, gone, {}).code(), Code::kNotFound);
}

}  // namespace
}  // namespace kc
