// The device side shared by the GPU GoogleTests: device 0's primary context made current, a
// non-blocking stream, and device allocations freed at teardown. A fixture decides in its SetUp
// whether to skip, then calls acquire().
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "runtime/cuda_api.h"
#include "runtime/cuda_backend.h"

namespace kc {

struct GpuFixture : ::testing::Test {
  const DriverApi* d = nullptr;
  Backend* b = nullptr;
  CUcontext primary = nullptr;
  CUdevice dev = 0;
  CUstream stream = nullptr;
  std::vector<CUdeviceptr> allocs;

  // The backend, the primary context (current) and the stream of device 0.
  void acquire(Backend* backend) {
    b = backend;
    d = cuda_driver().value();
    ASSERT_EQ(d->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(d->cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    ASSERT_EQ(d->cuCtxSetCurrent(primary), CUDA_SUCCESS);
    ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (!d) return;   // skipped before acquire()
    for (CUdeviceptr p : allocs) d->cuMemFree(p);
    if (stream) d->cuStreamDestroy(stream);
    if (primary) d->cuDevicePrimaryCtxRelease(dev);
  }
  // At least `min_bytes` of device memory, freed at teardown.
  CUdeviceptr alloc(size_t bytes, size_t min_bytes = 16) {
    CUdeviceptr p = 0;
    EXPECT_EQ(d->cuMemAlloc(&p, std::max(bytes, min_bytes)), CUDA_SUCCESS);
    allocs.push_back(p);
    return p;
  }
};

}  // namespace kc
