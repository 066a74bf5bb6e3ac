// `kernelcraft report`'s data and page (torch_ops/cli/report_data.h, report_html.h) over a cache
// written here: records of every kind, search states with and without records, a corrupt value,
// meta of the wrong shape, and strings that must not escape their HTML or JSON context.
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "tests/unit/test_util.h"
#include "torch_ops/cli/report_data.h"
#include "torch_ops/cli/report_html.h"

namespace kc::cli {
namespace {

using nlohmann::json;

const std::string kTarget = "cpu-x86_64+gcc-12.2.0";
const std::string kServedKey = "kc1|" + kTarget + "|aten::relu|fp32|self=T:f32[1024]s[1]a16";
const std::string kEagerKey = "kc1|" + kTarget + "|aten::relu|fp32|self=T:f32[64,64]s[64,1]a16";
const std::string kHandKey = "kc1|" + kTarget + "|aten::gelu|fp32|self=T:f32[256]s[1]a16|approximate=s:none";
const std::string kCorruptKey = "kc1|" + kTarget + "|aten::relu|fp32|self=T:f32[7]s[1]a16";
const std::string kSearchingKey = "kc1|" + kTarget + "|aten::sigmoid|fp32|self=T:f32[512]s[1]a16";

json stage(const char* name, double millis, json evidence = json::object()) {
  return {{"name", name}, {"outcome", "passed"}, {"summary", std::string(name) + " ok"},
          {"evidence", evidence}, {"millis", millis}};
}

// As evolve/worker/key_search.cpp promoted_record() writes it.
Record served_record() {
  Record r;
  r.key = kServedKey;
  r.op = "aten::relu";
  r.blob = "binary";
  r.determinism = Determinism::kBitwise;
  r.meta = {{"provenance", {{"by", "kernelcraft-evolve"}, {"verified", true}, {"at", "2026-12-01T10:00:00Z"}}},
            {"candidate", {{"id", "c-7"}, {"family", "cpu.unary"}, {"knobs", {{"vec", 8}, {"note", "</script><b>x"}}},
                           {"origin", "mutation"}, {"parents", {"c-1", "c-2"}}, {"generation", 2}}},
            {"timing", {{"median_ms", 0.004}, {"eager_median_ms", 0.01}, {"speedup", 2.5}, {"speedup_p10", 2.125},
                        {"pairs", 40}}},
            {"verification", {{"stages", {stage("static", 1.5), stage("compile", 400, {{"log", "a<b"}}),
                                          stage("numerics", 98.5), stage("sanitizer", 2000)}}}},
            {"search", {{"generations", 3}, {"evaluated", 5}, {"elapsed_s", 4.0}, {"finish_reason", "stagnation"},
                        {"first_verified_s", 0.5}, {"best_found_s", 3.0}, {"refused", json::array()}}}};
  return r;
}

json tried(const char* id, int gen, const char* verdict, double ms) {
  return {{"id", id}, {"family", "cpu.unary"}, {"verdict", verdict}, {"median_ms", ms}, {"generation", gen}};
}

void put(Store& s, const Record& r) { ASSERT_TRUE(s.put(r.key, encode_record(r)).is_ok()); }

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto st = Store::open(dir_.path, Store::Mode::kWriter);
    ASSERT_TRUE(st.is_ok()) << st.status().to_string();
    Store& s = *st.value();
    put(s, served_record());
    // Generation 1 found nothing better; generation 2 did (0.004 ms).
    json state = {{"key", kServedKey}, {"generation", 3}, {"elapsed_s", 4.5}, {"finished", true},
                  {"finish_reason", "stagnation"},
                  {"tried", {tried("c-1", 0, "passed", 0.006), tried("c-2", 0, "rejected", 0),
                             tried("c-3", 1, "passed", 0.007), tried("c-7", 2, "passed", 0.004),
                             tried("c-8", 2, "unsupported", 0)}}};
    ASSERT_TRUE(s.put("search|" + kServedKey, state.dump()).is_ok());
    Record eager;
    eager.key = kEagerKey;
    eager.op = "aten::relu";
    eager.state = RecordState::kEagerBest;
    eager.meta = {{"eager_median_ms", 0.02}, {"best_candidate_ms", 0.025},
                  {"search", {{"generations", 2}, {"evaluated", 9}, {"finish_reason", "generation limit"},
                              {"refused", {{{"id", "c-9<"}, {"stage", ""}, {"median_ms", 0.019},
                                            {"eager_median_ms", 0.02}}}}}}};
    put(s, eager);
    // Hand-made, never verified, meta of the wrong shapes (a writer we do not know).
    Record hand;
    hand.key = kHandKey;
    hand.op = "aten::gelu";
    hand.blob = "b";
    hand.meta = {{"timing", "fast"}, {"candidate", 3}, {"verification", {{"stages", {"x", {{"name", 5}}}}}}};
    put(s, hand);
    ASSERT_TRUE(s.put(kCorruptKey, "not cbor").is_ok());
    json running = {{"key", kSearchingKey}, {"generation", 0}, {"tried", {tried("s-1", 0, "passed", 0.5)}}};
    ASSERT_TRUE(s.put("search|" + kSearchingKey, running.dump()).is_ok());
    auto rep = collect_report(s, dir_.path);
    ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
    report_ = std::move(rep.value());
  }

  const KeyReport& key(const std::string& k) const {
    for (const auto& r : report_.keys)
      if (r.key == k) return r;
    ADD_FAILURE() << "no key " << k;
    return report_.keys.front();
  }

  test::TempDir dir_;
  Report report_;
};

TEST_F(ReportTest, EveryKeyWithItsState) {
  ASSERT_EQ(report_.keys.size(), 5u);
  EXPECT_EQ(key(kServedKey).state, KeyState::kServed);
  EXPECT_EQ(key(kEagerKey).state, KeyState::kEagerBest);
  EXPECT_EQ(key(kHandKey).state, KeyState::kUnverified);
  EXPECT_EQ(key(kCorruptKey).state, KeyState::kCorrupt);
  EXPECT_FALSE(key(kCorruptKey).error.empty());
  EXPECT_EQ(key(kSearchingKey).state, KeyState::kSearching);
  EXPECT_EQ(key(kSearchingKey).op, "aten::sigmoid");
  // Sorted by operator: gelu, relu x3, sigmoid.
  EXPECT_EQ(report_.keys.front().op, "aten::gelu");
  EXPECT_EQ(report_.keys.back().op, "aten::sigmoid");
}

TEST_F(ReportTest, ServedKeyNumbers) {
  const KeyReport& k = key(kServedKey);
  EXPECT_DOUBLE_EQ(k.speedup, 2.5);
  EXPECT_DOUBLE_EQ(k.speedup_p10, 2.125);
  EXPECT_EQ(k.pairs, 40);
  EXPECT_DOUBLE_EQ(k.bytes, 1024 * 4 * 2);            // self read, out0 written
  EXPECT_NEAR(gb_per_s(k.bytes, k.median_ms), 8192 / 4e-6 / 1e9, 1e-9);
  ASSERT_TRUE(k.lineage.has_value());
  EXPECT_EQ(k.lineage->id, "c-7");
  EXPECT_EQ(k.lineage->parents, (std::vector<std::string>{"c-1", "c-2"}));
  EXPECT_EQ(k.lineage->generation, 2);
  EXPECT_EQ(k.determinism, Determinism::kBitwise);
  ASSERT_EQ(k.stages.size(), 4u);
  EXPECT_NEAR(k.time.verification_s, 0.5, 1e-12);   // static + compile + numerics
  EXPECT_NEAR(k.time.sanitizer_s, 2.0, 1e-12);
  EXPECT_NEAR(k.time.search_s, 4.5, 1e-12);          // the search state's clock, resumes included
}

TEST_F(ReportTest, CurvePerGeneration) {
  const auto& c = key(kServedKey).curve;
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].evaluated, 2);
  EXPECT_EQ(c[0].passed, 1);
  EXPECT_DOUBLE_EQ(c[0].best_ms, 0.006);
  EXPECT_DOUBLE_EQ(c[1].best_ms, 0.007);
  EXPECT_DOUBLE_EQ(c[1].best_so_far_ms, 0.006);
  EXPECT_EQ(c[2].evaluated, 1);                       // "unsupported" is not an evaluation
  EXPECT_DOUBLE_EQ(c[2].best_so_far_ms, 0.004);
  // No search state: no curve, but the record's search facts.
  EXPECT_TRUE(key(kEagerKey).curve.empty());
  EXPECT_TRUE(key(kEagerKey).has_search);
  EXPECT_EQ(key(kEagerKey).evaluated, 9);
  EXPECT_FALSE(key(kHandKey).has_search);
}

TEST_F(ReportTest, WrongShapesReadAsAbsent) {
  const KeyReport& k = key(kHandKey);
  EXPECT_EQ(k.speedup, 0);
  EXPECT_FALSE(k.lineage.has_value());
  EXPECT_TRUE(k.stages.empty());
  const KeyReport& e = key(kEagerKey);
  EXPECT_DOUBLE_EQ(e.speedup, 0.02 / 0.025);
}

TEST_F(ReportTest, TotalsPerOperatorAndCache) {
  ASSERT_EQ(report_.ops.size(), 3u);
  const Totals& relu = report_.ops[1];
  EXPECT_EQ(relu.op, "aten::relu");
  EXPECT_EQ(relu.keys, 3u);
  EXPECT_EQ(relu.by_state.at(KeyState::kServed), 1u);
  EXPECT_EQ(relu.evaluated, 14u);
  EXPECT_DOUBLE_EQ(relu.best_speedup, 2.5);
  EXPECT_DOUBLE_EQ(relu.geomean_speedup, 2.5);
  EXPECT_EQ(report_.cache.keys, 5u);
  EXPECT_NEAR(report_.cache.time.sanitizer_s, 2.0, 1e-12);
}

TEST_F(ReportTest, JsonSaysWhatIsUnknown) {
  json j = to_json(report_);
  EXPECT_EQ(j["report_format"], kReportFormat);
  EXPECT_FALSE(j["peak"]["measured"].get<bool>());
  EXPECT_TRUE(j["peak"]["targets"].empty());
  ASSERT_EQ(j["keys"].size(), 5u);
  for (const auto& k : j["keys"]) {
    EXPECT_TRUE(k["bandwidth"]["fraction_of_peak"].is_null());
    if (k["key"] == kServedKey) {
      EXPECT_EQ(k["state"], "served");
      EXPECT_DOUBLE_EQ(k["timing"]["speedup"].get<double>(), 2.5);
      EXPECT_EQ(k["search"]["curve"].size(), 3u);
      EXPECT_EQ(k["lineage"]["parents"], json({"c-1", "c-2"}));
      EXPECT_EQ(k["stages"][3]["name"], "sanitizer");
    }
    if (k["key"] == kHandKey) {
      EXPECT_TRUE(k["timing"]["speedup"].is_null());
    }
  }
  EXPECT_EQ(j["cache"]["by_state"]["served"], 1);
}

// Two promoted records of one target timed the copy beside their kernels: the target's peak is
// their median, and each key's achieved bandwidth is put against it; another target has none.
TEST(ReportPeak, ATargetsPeakIsItsRecordsMedianCopyBandwidth) {
  test::TempDir dir;
  auto st = Store::open(dir.path, Store::Mode::kWriter);
  ASSERT_TRUE(st.is_ok()) << st.status().to_string();
  const std::string other = "kc1|cuda-sm_90+drv-13.0+nvrtc-13.0|aten::relu|fp32|self=T:f32[1024]s[1]a16";
  for (auto [key, copy] : {std::pair{kServedKey, 10.0}, std::pair{kEagerKey, 30.0}, std::pair{other, 0.0}}) {
    Record r = served_record();
    r.key = key;
    r.meta["timing"]["copy_gb_s"] = copy;
    put(*st.value(), r);
  }
  auto rep = collect_report(*st.value(), dir.path);
  ASSERT_TRUE(rep.is_ok()) << rep.status().to_string();
  ASSERT_EQ(rep.value().peaks.size(), 1u);
  const PeakBandwidth& p = peak_of(rep.value(), kServedKey);
  EXPECT_TRUE(p.measured);
  EXPECT_DOUBLE_EQ(p.gb_per_s, 20.0);
  EXPECT_EQ(p.samples, 2);
  EXPECT_FALSE(peak_of(rep.value(), other).measured);
  json j = to_json(rep.value());
  EXPECT_TRUE(j["peak"]["measured"].get<bool>());
  EXPECT_DOUBLE_EQ(j["peak"]["targets"][kTarget]["gb_per_s"].get<double>(), 20.0);
  for (const auto& k : j["keys"]) {
    // 1024 floats read and written (8 KiB) in 4 us: 2.048 GB/s, a tenth of 20.
    if (k["key"] == other) EXPECT_TRUE(k["bandwidth"]["fraction_of_peak"].is_null());
    else EXPECT_NEAR(k["bandwidth"]["fraction_of_peak"].get<double>(), k["bandwidth"]["gb_per_s"].get<double>() / 20.0, 1e-12);
  }
  const std::string page = render_report_html(rep.value());
  EXPECT_NE(page.find("% of peak)"), std::string::npos);
  EXPECT_NE(page.find("peak of <code>" + kTarget + "</code>"), std::string::npos);
}

TEST_F(ReportTest, PageShowsTheNumbersAndEscapesTheData) {
  const std::string page = render_report_html(report_);
  EXPECT_NE(page.find("2.50x"), std::string::npos);       // the served key's speedup
  EXPECT_NE(page.find("2.12x"), std::string::npos);       // its 10th percentile
  EXPECT_NE(page.find("4.00 µs"), std::string::npos);     // its median
  EXPECT_NE(page.find("peak not measured"), std::string::npos);
  EXPECT_NE(page.find("<td>c-9&lt;</td><td>timing (no clear gain)</td>"), std::string::npos);   // refused
  EXPECT_NE(page.find("<svg"), std::string::npos);
  // The knob "</script><b>x" appears escaped in the lineage table and never raw.
  EXPECT_EQ(page.find("</script><b>"), std::string::npos);
  EXPECT_NE(page.find("&lt;/script&gt;&lt;b&gt;x"), std::string::npos);
  EXPECT_NE(page.find("data-key=\"" + html_escape(kServedKey) + "\""), std::string::npos);
  // Exactly the page's own three scripts end: the error hook, the data block, the main script.
  size_t ends = 0;
  for (size_t p = page.find("</script>"); p != std::string::npos; p = page.find("</script>", p + 1)) ++ends;
  EXPECT_EQ(ends, 3u);
  // The embedded block parses back to exactly the --json data.
  const std::string open = "<script type=\"application/json\" id=\"kc-data\">";
  const size_t a = page.find(open) + open.size(), b = page.find("</script>", a);
  ASSERT_NE(b, std::string::npos);
  json embedded = json::parse(page.substr(a, b - a));
  json direct = to_json(report_);
  embedded.erase("generated_at");
  direct.erase("generated_at");
  EXPECT_EQ(embedded, direct);
}

TEST(ReportFormat, EscapesAndUnits) {
  EXPECT_EQ(html_escape("a|b<c>&\"'"), "a|b&lt;c&gt;&amp;&quot;&#39;");
  EXPECT_EQ(script_safe_json(json{{"s", "</script><!--"}}), "{\"s\":\"\\u003c/script>\\u003c!--\"}");
  EXPECT_EQ(format_ms(0.0123), "12.30 µs");
  EXPECT_EQ(format_ms(8.19), "8.190 ms");
  EXPECT_EQ(format_ms(0), "—");
  EXPECT_EQ(format_speedup(17.8), "17.80x");
  EXPECT_EQ(format_seconds(0), "—");
}

TEST(ReportEmpty, AnEmptyCacheIsAnEmptyReport) {
  test::TempDir dir;
  auto st = Store::open(dir.path, Store::Mode::kWriter);
  ASSERT_TRUE(st.is_ok());
  auto rep = collect_report(*st.value(), dir.path);
  ASSERT_TRUE(rep.is_ok());
  EXPECT_TRUE(rep->keys.empty());
  EXPECT_EQ(rep->cache.keys, 0u);
  const std::string page = render_report_html(rep.value());
  EXPECT_NE(page.find("0 key(s)"), std::string::npos);
}

}  // namespace
}  // namespace kc::cli
