// The evaluation child's memory budget (evolve/verify/memory_cap.h): which keys keep their input
// sets resident, on the host and on a CUDA device.
#include <gtest/gtest.h>

#include "evolve/ops/op_call.h"
#include "evolve/verify/memory_cap.h"

namespace kc::evolve {
namespace {

OpCall relu_call(std::vector<int64_t> sizes, BackendKind be) {
  auto c = make_call(OpId::kRelu, sizes, DType::kF32, be);
  EXPECT_TRUE(c.is_ok());
  return c.value();
}

// Up to 8 MiB of tensors every key is resident; above, a CUDA key is resident only where 54x its
// tensors fit a quarter of the device's free memory, and a CPU key never (the host rule alone).
TEST(MemoryCap, ResidentSetsWhereTheDeviceHasRoom) {
  constexpr int64_t GiB = int64_t{1} << 30;
  const OpCall small = relu_call({512, 1024}, BackendKind::kCuda);        // 4 MiB of tensors
  const OpCall mid = relu_call({4096, 4096}, BackendKind::kCuda);         // 128 MiB: 6.75 GiB resident
  const OpCall mid_cpu = relu_call({4096, 4096}, BackendKind::kCpu);
  ASSERT_EQ(call_tensor_bytes(mid), 128 << 20);
  EXPECT_TRUE(sets_resident(small, 0));
  EXPECT_FALSE(sets_resident(mid, 0)) << "free memory unknown: streamed";
  EXPECT_TRUE(sets_resident(mid, 28 * GiB));
  EXPECT_FALSE(sets_resident(mid, 26 * GiB)) << "6.75 GiB is over a quarter of 26 GiB";
  EXPECT_FALSE(sets_resident(mid_cpu, 1000 * GiB));
}

}  // namespace
}  // namespace kc::evolve
