// Job files and the worker lock (runtime/worker_client.h): one job per key across submitters, a
// round trip of its fields, and a lock that only one worker holds and that liveness probes see.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "runtime/cache_dir.h"
#include "runtime/fsutil.h"
#include "runtime/worker_client.h"
#include "test_util.h"

namespace kc {
namespace {

TEST(WorkerClient, OneJobPerKeyAndRoundTrip) {
  test::TempDir d;
  Job j;
  j.key = "kc1|cpu|aten::relu|fp32|self=T:f32[4]s[1]a16";
  j.device = 3;
  j.inputs = std::string("\0\1\2pickle", 9);
  j.settings = {{"search", {{"lambda", 4}}}};
  ASSERT_TRUE(submit_job(d.path, j).is_ok());
  EXPECT_TRUE(job_pending(d.path, j.key));
  Status again = submit_job(d.path, j);
  EXPECT_EQ(again.code(), Code::kBusy);
  auto jobs = list_jobs(d.path);
  ASSERT_EQ(jobs.size(), 1u);
  auto back = read_job(jobs[0]);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value().key, j.key);
  EXPECT_EQ(back.value().device, 3);
  EXPECT_EQ(back.value().inputs, j.inputs);
  EXPECT_EQ(back.value().settings["search"]["lambda"], 4);
}

TEST(WorkerClient, CorruptJobIsAStatus) {
  test::TempDir d;
  std::string p = d.path + "/x.job";
  FILE* f = fopen(p.c_str(), "wb");
  fputs("not cbor at all", f);
  fclose(f);
  EXPECT_FALSE(read_job(p).is_ok());
  EXPECT_FALSE(read_job(d.path + "/missing.job").is_ok());
}

TEST(WorkerClient, OneWorkerHoldsTheLock) {
  test::TempDir d;
  EXPECT_FALSE(worker_alive(d.path));
  {
    auto a = WorkerLock::acquire(d.path);
    ASSERT_TRUE(a.is_ok());
    // flock locks belong to open file descriptions: a second acquire, even in this process, fails.
    auto b = WorkerLock::acquire(d.path);
    EXPECT_EQ(b.status().code(), Code::kBusy);
    EXPECT_TRUE(worker_alive(d.path));
    EXPECT_EQ(worker_pid(d.path), static_cast<int>(getpid()));
  }
  EXPECT_FALSE(worker_alive(d.path));
  EXPECT_EQ(worker_pid(d.path), 0);
}

TEST(WorkerClient, StartWorkerWithoutExecutableIsAStatus) {
  test::TempDir d;
  auto r = start_worker(d.path, d.path + "/no-such-kernelcraft", {});
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
}

}  // namespace
}  // namespace kc

namespace kc {
namespace {

std::string slurp(const std::string& p) {
  std::string s;
  if (FILE* f = fopen(p.c_str(), "rb")) {
    char buf[256];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    fclose(f);
  }
  return s;
}

// Every file the project writes in the cache dir, planted as a symlink to a victim file first:
// the victim must stay untouched (runtime/cache_dir.h).
TEST(CacheDirSafety, PlantedSymlinksAreNeverWrittenThrough) {
  test::TempDir d, elsewhere;
  const std::string victim = elsewhere.path + "/victim";
  FILE* f = fopen(victim.c_str(), "wb");
  fputs("precious", f);
  fclose(f);
  const std::string cache = d.path + "/cache";
  Job j;
  j.key = "kc1|cpu|aten::relu|fp32|self=T:f32[4]s[1]a16";
  ASSERT_TRUE(submit_job(cache, j).is_ok());   // creates cache/ and jobs/
  ASSERT_EQ(unlink(job_path(cache, j.key).c_str()), 0);
  // The temporary a submit writes, and the lock.
  const std::string tmp = jobs_dir(cache) + "/.tmp-" + std::to_string(getpid()) + "-" + fnv1a64_hex(j.key);
  ASSERT_EQ(symlink(victim.c_str(), tmp.c_str()), 0);
  ASSERT_EQ(symlink(victim.c_str(), (cache + "/worker.lock").c_str()), 0);
  EXPECT_TRUE(submit_job(cache, j).is_ok());
  EXPECT_FALSE(WorkerLock::acquire(cache).is_ok());
  EXPECT_EQ(worker_pid(cache), 0);
  // A job name that is a link: "already pending", nothing written.
  Job k;
  k.key = j.key + "x";
  ASSERT_EQ(symlink(victim.c_str(), job_path(cache, k.key).c_str()), 0);
  EXPECT_EQ(submit_job(cache, k).code(), Code::kBusy);
  EXPECT_FALSE(read_job(job_path(cache, k.key)).is_ok());
  // Write helpers refuse links outright.
  EXPECT_FALSE(write_new_file(cache + "/worker.lock", "x").is_ok());
  EXPECT_EQ(slurp(victim), "precious");
}

TEST(CacheDirSafety, ForeignOrWritableDirectoriesAreRefusedUnlessShared) {
  test::TempDir d;
  const std::string cache = d.path + "/new";
  ASSERT_TRUE(prepare_cache_dir(cache).is_ok());
  struct stat st{};
  ASSERT_EQ(stat(cache.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "a cache we create is private";
  ASSERT_EQ(chmod(cache.c_str(), 0777), 0);
  Status s = prepare_cache_dir(cache);
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("writable by group or others"), std::string::npos) << s.message();
  Job j;
  j.key = "kc1|cpu|aten::relu|fp32|self=T:f32[4]s[1]a16";
  EXPECT_FALSE(submit_job(cache, j).is_ok());
  EXPECT_FALSE(WorkerLock::acquire(cache).is_ok());
  set_cache_dir_shared(true);
  EXPECT_TRUE(submit_job(cache, j).is_ok());
  set_cache_dir_shared(false);
  // A jobs/ that is a symlink is refused.
  test::TempDir other;
  const std::string c2 = other.path + "/c";
  ASSERT_TRUE(prepare_cache_dir(c2).is_ok());
  ASSERT_EQ(symlink(d.path.c_str(), (c2 + "/jobs").c_str()), 0);
  EXPECT_FALSE(submit_job(c2, j).is_ok());
}

}  // namespace
}  // namespace kc
