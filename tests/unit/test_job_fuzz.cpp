// Fuzzing what the worker reads from disk: thousands of mutated job files (byte flips, truncations,
// a wrong type in every field, huge numbers, deep nesting) and search states go through exactly the
// worker's validation (check_job_file, parse_search_state). None may throw or crash; typed
// mutations must be refused with a reason, and the unmutated job must still be accepted.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "evolve/search/search.h"
#include "evolve/worker/worker.h"
#include "runtime/config.h"
#include "runtime/fsutil.h"
#include "runtime/worker_client.h"
#include "test_util.h"

namespace kc::evolve {
namespace {

using json = nlohmann::json;

std::string relu_key() { return "kc1|cpu-test|aten::relu|fp32|self=T:f32[64,37]s[37,1]a16"; }

json good_job() {
  return {{"format", 1}, {"key", relu_key()}, {"device", 0}, {"inputs", json::binary_t({1, 2, 3})},
          {"settings", {{"search", {{"mu", 4}, {"lambda", 8}, {"max_generations", 2}, {"key_budget_s", 60.0}}},
                        {"candidate_timeout_s", 180.0}}},
          {"submitted_unix_ms", 1700000000000}, {"submitter_pid", 42}};
}

std::string cbor(const json& j) {
  auto b = json::to_cbor(j);
  return std::string(b.begin(), b.end());
}

// The worker's whole check of one job file's bytes: through a file (check_job_file, what the worker
// and `kernelcraft job-check` run) or, for the bulk of the cases, straight from memory (the same
// parse_job + job_options without the file system's latency).
Status check_bytes(const std::string& dir, const std::string& bytes, bool via_file = true) {
  if (!via_file) {
    auto job = parse_job(bytes);
    if (!job) return job.status();
    auto r = job_options(EvolveOptions{}, job.value());
    return r ? Status::ok() : r.status();
  }
  const std::string p = dir + "/fuzz.job";
  EXPECT_TRUE(write_file(p, bytes));
  auto r = check_job_file(EvolveOptions{}, p);
  return r ? Status::ok() : r.status();
}

// Values of every wrong kind, and numbers at the edges.
std::vector<json> wrong_values() {
  return {json("4"), json::array({1, 2}), json::object({{"a", 1}}), json(true), json(nullptr),
          json(INT64_MAX), json(INT64_MIN), json(UINT64_MAX), json(1e308), json(-1), json(0.5),
          json::binary_t({0xff})};
}

// Evolution settings have one channel (runtime/config.h evolution_settings, read back by
// apply_evolve_json): every one of them arrives, and the job's own settings are that same object.
TEST(SettingsChannel, EveryEvolutionSettingArrivesThroughTheOneObject) {
  Config c;
  c.evolve_mu = 3;
  c.evolve_lambda = 5;
  c.evolve_generations = 7;
  c.evolve_key_budget_s = 42;
  c.evolve_candidate_timeout_s = 33;
  c.evolve_gpu_share = 0.25;
  c.evolve_jobs = 2;
  c.evolve_memory_share = 0.3;
  c.llm_api = "anthropic";
  c.llm_url = "http://127.0.0.1:9/x";
  c.llm_model = "m";
  c.llm_key_env = "K";
  EvolveOptions o;
  ASSERT_TRUE(apply_evolve_json(o, evolution_settings(c)).is_ok());
  EXPECT_EQ(o.search.mu, 3);
  EXPECT_EQ(o.search.lambda, 5);
  EXPECT_EQ(o.search.max_generations, 7);
  EXPECT_EQ(o.search.key_budget_s, 42);
  EXPECT_EQ(o.candidate_timeout_s, 33);
  EXPECT_EQ(o.gpu_share, 0.25);
  EXPECT_EQ(o.jobs, 2);
  EXPECT_EQ(o.memory_share, 0.3);
  EXPECT_EQ(o.llm.api, "anthropic");
  EXPECT_EQ(o.llm.url, "http://127.0.0.1:9/x");
  EXPECT_EQ(o.llm.model, "m");
  EXPECT_EQ(o.llm.key_env, "K");
  json bad = evolution_settings(c);
  bad["gpu_share"] = 0;
  EXPECT_FALSE(apply_evolve_json(o, bad).is_ok()) << "a duty cycle of 0 is refused";
}

TEST(JobFuzz, GoodJobIsAccepted) {
  test::TempDir d;
  Status s = check_bytes(d.path, cbor(good_job()));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(JobFuzz, AWrongTypeInEveryFieldIsRefusedNotThrown) {
  test::TempDir d;
  int refused = 0, cases = 0;
  const std::vector<std::vector<std::string>> paths = {
      {"format"}, {"key"}, {"device"}, {"inputs"}, {"settings"}, {"submitted_unix_ms"}, {"submitter_pid"},
      {"settings", "candidate_timeout_s"}, {"settings", "min_gain"}, {"settings", "min_pair_wins"},
      {"settings", "max_promote_tries"}, {"settings", "search"}, {"settings", "search", "mu"},
      {"settings", "search", "lambda"}, {"settings", "search", "max_generations"}, {"settings", "search", "patience"},
      {"settings", "search", "target_speedup"}, {"settings", "search", "max_candidates"},
      {"settings", "search", "key_budget_s"}, {"settings", "search", "seed"}};
  for (const auto& path : paths)
    for (const json& v : wrong_values()) {
      json j = good_job();
      json* at = &j;
      for (size_t k = 0; k + 1 < path.size(); ++k) at = &(*at)[path[k]];
      (*at)[path.back()] = v;
      Status s;
      ASSERT_NO_THROW(s = check_bytes(d.path, cbor(j), cases % 10 == 0));
      ++cases;
      if (!s) {
        ++refused;
        EXPECT_FALSE(s.message().empty());
      }
    }
  // The poison job: a string where a number belongs.
  json poison = good_job();
  poison["settings"]["search"]["lambda"] = "8";
  EXPECT_FALSE(check_bytes(d.path, cbor(poison)).is_ok());
  // Most substitutions are wrong (a few are in range, e.g. 0.5 as a timeout floor or null = absent).
  EXPECT_GT(refused, cases * 2 / 3) << refused << " of " << cases;
}

TEST(JobFuzz, ThousandsOfByteMutationsNeverThrow) {
  test::TempDir d;
  const std::string base = cbor(good_job());
  std::mt19937_64 rng(7);
  int accepted = 0;
  constexpr int kCases = 4000;
  for (int i = 0; i < kCases; ++i) {
    std::string b = base;
    switch (i % 4) {
      case 0:   // flips
        for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k) b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:   // truncation
        b.resize(rng() % b.size());
        break;
      case 2:   // random bytes overwritten
        for (int k = 0; k < 8; ++k) b[rng() % b.size()] = static_cast<char>(rng());
        break;
      default:  // bytes inserted (huge declared lengths among them)
        b.insert(rng() % b.size(), std::string(1 + rng() % 9, static_cast<char>(0x5b + rng() % 5)));
    }
    Status s;
    ASSERT_NO_THROW(s = check_bytes(d.path, b, i % 50 == 0));
    accepted += s.is_ok();
  }
  EXPECT_LT(accepted, kCases / 2);
}

TEST(JobFuzz, DeepNestingAndHugeFilesAreRefused) {
  test::TempDir d;
  // 200k nested arrays at the top and inside settings: the CBOR reader must not recurse into them.
  EXPECT_FALSE(check_bytes(d.path, std::string(200000, '\x81') + '\x00').is_ok());
  json j = good_job();
  json deep = json::array();
  json* at = &deep;
  for (int k = 0; k < 100; ++k) at = &(*at)[0];
  j["settings"]["search"]["mu"] = deep;
  EXPECT_FALSE(check_bytes(d.path, cbor(j)).is_ok());
  // A declared length of 2^64-1 bytes in a ten-byte file.
  EXPECT_FALSE(check_bytes(d.path, std::string("\xa1\x61k\x5b\xff\xff\xff\xff\xff\xff\xff\xff", 12)).is_ok());
  // A symlink is never read as a job.
  const std::string link = d.path + "/link.job";
  ASSERT_EQ(symlink("/dev/zero", link.c_str()), 0);
  EXPECT_FALSE(read_job(link).is_ok());
}

TEST(SearchStateFuzz, DamagedStatesAreRefusedNotThrown) {
  auto call = make_call(OpId::kRelu, {64, 37}, DType::kF32, BackendKind::kCpu);
  ASSERT_TRUE(call.is_ok());
  SearchOptions o;
  Search s(call.value(), o);
  auto batch = s.next_batch();
  ASSERT_FALSE(batch.empty());
  Evaluation e;
  e.id = batch[0].id();
  e.family = batch[0].family;
  e.knobs = batch[0].knobs;
  e.verdict = "passed";
  e.median_ms = 1;
  s.report(e);
  const std::string text = to_json(s.state()).dump();
  ASSERT_TRUE(parse_search_state(text).is_ok());
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string b = text;
    if (i % 2) b[rng() % b.size()] = static_cast<char>(rng());
    else b.resize(rng() % b.size());
    Result<SearchState> r = Status::ok();
    ASSERT_NO_THROW(r = parse_search_state(b));
    // Whatever parses must be usable by the search without throwing.
    if (r) {
      ASSERT_NO_THROW({ Search t(call.value(), o, r.value()); (void)t.next_batch(); });
    }
  }
  for (const char* field : {"generation", "tried", "pending", "proposals", "finished", "best_ms"})
    for (const json& v : wrong_values()) {
      json j = json::parse(text);
      j[field] = v;
      Result<SearchState> r = Status::ok();
      ASSERT_NO_THROW(r = parse_search_state(j.dump()));
      if (r) {
      ASSERT_NO_THROW({ Search t(call.value(), o, r.value()); (void)t.next_batch(); });
    }
    }
  EXPECT_FALSE(parse_search_state(std::string(100000, '[')).is_ok());
}

}  // namespace
}  // namespace kc::evolve
