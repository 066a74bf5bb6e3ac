// Job files and the worker lock (runtime/worker_client.h): one job per key across submitters, a
// round trip of its fields, and a lock that only one worker holds and that liveness probes see.
#include <gtest/gtest.h>

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
