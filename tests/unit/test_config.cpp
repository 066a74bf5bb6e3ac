// Configuration: op lists, JSON application, environment precedence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/config.h"
#include "runtime/ops.h"

namespace kc {
namespace {

TEST(Config, OpListForms) {
  auto all = parse_op_list("all");
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all->size(), static_cast<size_t>(kNumOps));
  auto some = parse_op_list("relu, softmax");
  ASSERT_TRUE(some.is_ok());
  EXPECT_EQ(some.value(), (std::vector<std::string>{"relu", "softmax"}));
  auto minus = parse_op_list("-gelu,-aten::_softmax");
  ASSERT_TRUE(minus.is_ok());
  EXPECT_EQ(std::count(minus->begin(), minus->end(), "gelu"), 0);
  EXPECT_EQ(std::count(minus->begin(), minus->end(), "softmax"), 0);
  EXPECT_EQ(std::count(minus->begin(), minus->end(), "relu"), 1);
  auto none = parse_op_list("none");
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->empty());
  auto bad = parse_op_list("relu,nonsense");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalid);
  EXPECT_NE(bad.status().message().find("nonsense"), std::string::npos);
}

TEST(Config, ApplyJsonIsAllOrNothing) {
  Config c;
  c.cxx = "g++";
  Status s = apply_json(c, nlohmann::json{{"cxx", "clang++"}, {"precision", "fp8"}});
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(c.cxx, "g++");   // unchanged on error
  ASSERT_TRUE(apply_json(c, nlohmann::json{{"cxx", "clang++"}, {"ops", {"relu"}}, {"catch_up_ms", 7}}).is_ok());
  EXPECT_EQ(c.cxx, "clang++");
  EXPECT_EQ(c.ops, std::vector<std::string>{"relu"});
  EXPECT_EQ(c.catch_up_ms, 7);
  EXPECT_FALSE(apply_json(c, nlohmann::json{{"unknown_key", 1}}).is_ok());
  EXPECT_FALSE(apply_json(c, nlohmann::json{{"enabled", "yes"}}).is_ok());
  EXPECT_FALSE(apply_json(c, nlohmann::json::array()).is_ok());
}

TEST(Config, LiveCheckAndDeterminismSettings) {
  Config c;
  EXPECT_EQ(c.shadow_calls, 4);
  EXPECT_EQ(c.shadow_every, 1000);
  EXPECT_FALSE(c.deterministic_only);
  setenv("KERNELCRAFT_SHADOW_CALLS", "2", 1);
  setenv("KERNELCRAFT_SHADOW_EVERY", "0", 1);
  setenv("KERNELCRAFT_DETERMINISTIC_ONLY", "1", 1);
  c = load_config();
  unsetenv("KERNELCRAFT_SHADOW_CALLS");
  unsetenv("KERNELCRAFT_SHADOW_EVERY");
  unsetenv("KERNELCRAFT_DETERMINISTIC_ONLY");
  EXPECT_EQ(c.shadow_calls, 2);
  EXPECT_EQ(c.shadow_every, 0);
  EXPECT_TRUE(c.deterministic_only);
  ASSERT_TRUE(apply_json(c, nlohmann::json{{"shadow_every", -5}, {"deterministic_only", false}}).is_ok());
  EXPECT_EQ(c.shadow_every, 0) << "negative counts clamp to off";
  EXPECT_FALSE(c.deterministic_only);
  EXPECT_FALSE(apply_json(c, nlohmann::json{{"shadow_calls", "many"}}).is_ok());
}

TEST(Config, FileThenEnvironment) {
  std::string path = ::testing::TempDir() + "/kc_config_test.json";
  std::ofstream(path) << R"({"ops": "relu,gelu", "cache_dir": "/from/file", "precision": "tf32"})";
  setenv("KERNELCRAFT_CONFIG", path.c_str(), 1);
  setenv("KERNELCRAFT_CACHE_DIR", "/from/env", 1);
  Config c = load_config();
  unsetenv("KERNELCRAFT_CONFIG");
  unsetenv("KERNELCRAFT_CACHE_DIR");
  EXPECT_EQ(c.ops, (std::vector<std::string>{"relu", "gelu"}));
  EXPECT_EQ(c.cache_dir, "/from/env");
  EXPECT_EQ(c.policy, "tf32");
}

TEST(Config, EvolveSandboxIsOnByDefaultAndTakesThreeValues) {
  Config c;
  EXPECT_EQ(c.evolve_sandbox, EvolveSandbox::kCpu);
  EXPECT_EQ(to_json(c)["evolve_sandbox"], "cpu");
  ASSERT_TRUE(apply_json(c, {{"evolve_sandbox", "off"}}).is_ok());
  EXPECT_EQ(c.evolve_sandbox, EvolveSandbox::kOff);
  EXPECT_EQ(apply_json(c, {{"evolve_sandbox", "none"}}).code(), Code::kInvalid);
  EXPECT_EQ(c.evolve_sandbox, EvolveSandbox::kOff);
  setenv("KERNELCRAFT_EVOLVE_SANDBOX", "all", 1);
  EXPECT_EQ(load_config().evolve_sandbox, EvolveSandbox::kAll);
  unsetenv("KERNELCRAFT_EVOLVE_SANDBOX");
}

TEST(Config, EveryFieldIsDocumented) {
  Config c;
  auto j = to_json(c);
  EXPECT_EQ(j.size(), config_fields().size());
  for (const auto& f : config_fields()) EXPECT_TRUE(j.contains(f.json_key)) << f.json_key;
}

}  // namespace
}  // namespace kc

namespace kc {
namespace {

// README.md's configuration table is the settings table: same rows, same order, same text.
TEST(Config, ReadmeTableIsTheSettingsTable) {
  std::ifstream f(std::string(KC_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(f) << "README.md";
  std::vector<std::string> readme;
  bool in = false;
  for (std::string line; std::getline(f, line);) {
    if (line == "| JSON key | environment | meaning |") in = true;
    else if (in && line.rfind("|", 0) != 0) break;
    else if (in && line != "|---|---|---|") readme.push_back(line);
  }
  std::vector<std::string> want;
  std::string table = "| JSON key | environment | meaning |\n|---|---|---|\n";
  for (const auto& s : config_fields()) {
    want.push_back(std::string("| ") + s.json_key + " | " + s.env + " | " + s.help + " |");
    table += want.back() + "\n";
  }
  EXPECT_EQ(readme, want) << "README.md's table should read:\n" << table;
}

// The environment goes through the same checks as the file: a bad value is logged and ignored.
TEST(Config, EnvironmentValuesAreCheckedLikeJson) {
  setenv("KERNELCRAFT_DISABLE", "1", 1);
  setenv("KERNELCRAFT_EVOLVE_NICE", "40", 1);
  setenv("KERNELCRAFT_CATCH_UP_MS", "soon", 1);
  setenv("KERNELCRAFT_PRECISION", "fp8", 1);
  setenv("KERNELCRAFT_EVOLVE_JOBS", "3", 1);
  Config c = load_config();
  for (const char* v : {"KERNELCRAFT_DISABLE", "KERNELCRAFT_EVOLVE_NICE", "KERNELCRAFT_CATCH_UP_MS",
                        "KERNELCRAFT_PRECISION", "KERNELCRAFT_EVOLVE_JOBS"})
    unsetenv(v);
  EXPECT_FALSE(c.enabled);
  EXPECT_EQ(c.evolve_nice, 19) << "clamped into 0..19";
  EXPECT_EQ(c.catch_up_ms, Config().catch_up_ms) << "not a number: the default stays";
  EXPECT_EQ(c.policy, "fp32") << "not a policy: the default stays";
  EXPECT_EQ(c.evolve_jobs, 3);
}

}  // namespace
}  // namespace kc
