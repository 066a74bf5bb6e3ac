// A damaged cache is salvaged, never made worse: listing gets past a damaged table block, and
// `cache repair` (kernel_cache/repair.h) keeps a backup, recovers what reads and counts the rest.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_cache/record.h"
#include "kernel_cache/repair.h"
#include "kernel_cache/store.h"
#include "tests/unit/test_util.h"

namespace kc {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr int kRecords = 400;

std::string key_of(int i) { return "kc1|cpu-test|aten::relu|fp32|self=T:f32[" + std::to_string(i) + "]s[1]a16"; }

// kRecords records with 2 KiB of incompressible binary each, flushed into table files.
void fill(const std::string& dir) {
  std::mt19937 rng(7);
  {
    auto st = Store::open(dir, Store::Mode::kWriter, 1000);
    ASSERT_TRUE(st) << st.status().to_string();
    for (int i = 0; i < kRecords; ++i) {
      Record r;
      r.key = key_of(i);
      r.op = "aten::relu";
      r.backend = BackendKind::kCpu;
      r.source = "// kernel " + std::to_string(i);
      r.blob.resize(2048);
      for (auto& c : r.blob) c = static_cast<char>(rng());
      ASSERT_TRUE(st.value()->put(r.key, encode_record(r)).is_ok());
    }
  }
  // A writer's next session flushes the previous one's log into a table file.
  ASSERT_TRUE(Store::open(dir, Store::Mode::kWriter, 1000));
}

// Flips 4 KiB in the middle of the largest table file (a damaged disk sector).
void flip_table(const std::string& dir) {
  fs::path victim;
  uintmax_t best = 0;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".sst" && e.file_size() > best) victim = e.path(), best = e.file_size();
  ASSERT_GT(best, 64u * 1024) << "no table file to damage";
  std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> buf(4096);
  f.seekg(static_cast<std::streamoff>(best / 2));
  f.read(buf.data(), buf.size());
  for (auto& c : buf) c = static_cast<char>(~c);
  f.seekp(static_cast<std::streamoff>(best / 2));
  f.write(buf.data(), buf.size());
}

struct Listing {
  int good = 0, bad = 0;
  size_t damaged = 0;
  Status status;
};

Listing list(const std::string& dir) {
  Listing l;
  auto st = Store::open(dir, Store::Mode::kReadOnly);
  if (!st) {
    l.status = st.status();
    return l;
  }
  l.status = st.value()->scan("kc", [&](const std::string& k, const std::string& v) {
    auto r = decode_record(v);
    (r && r->key == k) ? ++l.good : ++l.bad;
    return true;
  }, &l.damaged);
  return l;
}

TEST(Repair, ListingGetsPastADamagedBlock) {
  TempDir t;
  fill(t.path);
  flip_table(t.path);
  Listing l = list(t.path);
  EXPECT_TRUE(l.status.is_ok()) << l.status.to_string();
  EXPECT_GE(l.damaged, 1u) << "the flipped block was not noticed";
  // 4 KiB of 800 KiB: a few records are hit; everything else must still be listed.
  EXPECT_GE(l.good, kRecords - 16) << "bad " << l.bad << ", damaged regions " << l.damaged;
  EXPECT_LT(l.good, kRecords);
  // Without asking to skip damage, the scan reports it.
  auto st = Store::open(t.path, Store::Mode::kReadOnly);
  ASSERT_TRUE(st);
  EXPECT_EQ(st.value()->scan("kc", [](const std::string&, const std::string&) { return true; }).code(), Code::kCorrupt);
}

TEST(Repair, RecoversWhatReadsKeepsABackupAndCounts) {
  TempDir t;
  fill(t.path);
  flip_table(t.path);
  auto rep = repair_cache(t.path);
  ASSERT_TRUE(rep) << rep.status().to_string();
  EXPECT_GE(rep->records, static_cast<size_t>(kRecords - 16));
  EXPECT_LT(rep->records, static_cast<size_t>(kRecords)) << "the damage went unnoticed";
  ASSERT_TRUE(fs::is_directory(rep->backup_dir));
  bool has_table = false;
  for (auto& e : fs::directory_iterator(rep->backup_dir)) has_table |= e.path().extension() == ".sst";
  EXPECT_TRUE(has_table) << "the backup lacks the damaged table file";
  // After the repair every record left decodes, with checksums on (a writer's view).
  auto st = Store::open(t.path, Store::Mode::kWriter, 1000);
  ASSERT_TRUE(st) << st.status().to_string();
  size_t n = 0;
  Status s = st.value()->scan("kc", [&](const std::string& k, const std::string& v) {
    auto r = decode_record(v);
    EXPECT_TRUE(r && r->key == k) << k;
    ++n;
    return true;
  });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(n, rep->records);
}

TEST(Repair, LostCurrentIsRefusedThenRepaired) {
  TempDir t;
  fill(t.path);
  fs::remove(t.path + "/CURRENT");
  for (auto mode : {Store::Mode::kWriter, Store::Mode::kReadOnly, Store::Mode::kReader}) {
    auto st = Store::open(t.path, mode, 100);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.status().code(), Code::kCorrupt) << st.status().to_string();
  }
  EXPECT_FALSE(fs::exists(t.path + "/CURRENT")) << "a refused open created a database";
  auto rep = repair_cache(t.path);
  ASSERT_TRUE(rep) << rep.status().to_string();
  EXPECT_EQ(rep->records, static_cast<size_t>(kRecords));
  EXPECT_EQ(rep->dropped, 0u);
}

TEST(Repair, NothingToRepair) {
  TempDir t;
  auto rep = repair_cache(t.path);
  ASSERT_FALSE(rep);
  EXPECT_EQ(rep.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace kc
