// The live check's CUDA comparison kernel in the cache directory: built with NVRTC (no GPU needed)
// where a CUDA record is stored, written whole or not at all, read back by target.
#include <gtest/gtest.h>

#include <string>

#include "kernel_cache/key.h"
#include "kernel_cache/live_compare.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "runtime/cuda_backend.h"
#include "runtime/fsutil.h"
#include "test_util.h"

namespace kc {
namespace {

const char* kTarget = "cuda-sm_90+drv-13000+nvrtc-13.0";

TEST(LiveCompare, OnlyCudaTargetsAndNothingBeforeItIsBuilt) {
  test::TempDir d;
  EXPECT_EQ(ensure_live_compare(d.path, "cpu-x86_64-v3+gcc-12.2.0").code(), Code::kInvalid);
  EXPECT_EQ(read_live_compare(d.path, kTarget).status().code(), Code::kNotFound);
  EXPECT_EQ(live_compare_path(d.path, "cuda-sm_90+a|b").find('|'), std::string::npos) << "a file name, not a path";
}

TEST(LiveCompare, BuildsEveryEntryOnceAndReadsItBack) {
  SKIP_WITHOUT_NVRTC();
  test::TempDir d;
  ASSERT_TRUE(ensure_live_compare(d.path, kTarget).is_ok());
  auto b = read_live_compare(d.path, kTarget);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b.value().compare(0, 4, "\x7f" "ELF"), 0) << "a CUBIN";
  for (const char* e : {"kc_live_zero", "kc_live_sum_f32", "kc_live_err_f32", "kc_live_sum_f64", "kc_live_err_f64",
                        "kc_live_sum_f16", "kc_live_err_f16", "kc_live_sum_bf16", "kc_live_err_bf16"})
    EXPECT_NE(b.value().find(e), std::string::npos) << e << " missing from the CUBIN";
  // Present: not rebuilt (the build is for a process that has none yet, not every store).
  ASSERT_TRUE(write_file(live_compare_path(d.path, kTarget), "kept"));
  EXPECT_TRUE(ensure_live_compare(d.path, kTarget).is_ok());
  EXPECT_EQ(read_live_compare(d.path, kTarget).value(), "kept");
  bool no_tmp = true;
  list_dir(d.path + "/live-check", [&](const std::string& n) { no_tmp &= n.find(".tmp") == std::string::npos; });
  EXPECT_TRUE(no_tmp) << "the private name is renamed, never left behind";
}

TEST(LiveCompare, StoringAServedCudaRecordBuildsIt) {
  SKIP_WITHOUT_NVRTC();
  test::TempDir d;
  KeyBuilder k(kTarget, "aten::relu", "fp32");
  const int64_t sizes[1] = {32}, strides[1] = {1};
  k.tensor("self", DType::kF32, sizes, strides, 1, 16);
  const nlohmann::json launch = {{"version", 1},
                                 {"launches", {{{"entry", "kc_relu"}, {"grid", {1, 1, 1}}, {"block", {32, 1, 1}},
                                                {"smem", 0}, {"args", {"ptr:out0", "ptr:self"}}}}}};
  auto r = make_manual_record(k.take(), "extern \"C\" __global__ void kc_relu(float* o, const float* x) {}\n", launch,
                              "test");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(put_record(d.path, r.value()).is_ok());
  EXPECT_TRUE(read_live_compare(d.path, kTarget).is_ok());
}

}  // namespace
}  // namespace kc
