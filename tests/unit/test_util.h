// Small helpers shared by the unit tests: temporary directories, file polling, NVRTC skips.
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/cuda_backend.h"

namespace kc::test {

// A fresh directory under the system temp dir, removed (with everything in it) on destruction.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kc-test-XXXXXX").string();
    if (mkdtemp(tmpl.data())) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// Polls for `path` to exist; false after timeout_ms.
inline bool wait_for_file(const std::string& path, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace kc::test

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kTestAsan = true;   // NVRTC's compiles fail under ASan (BUILTIN_OPERATION_FAILURE)
#else
inline constexpr bool kTestAsan = false;
#endif

// CI sets KERNELCRAFT_REQUIRE_NVRTC=1: there a missing NVRTC is a failure, not a skip, so the
// "every shipped CUDA source compiles" checks can never pass vacuously.
#define SKIP_WITHOUT_NVRTC()                                                         \
  do {                                                                               \
    if (kTestAsan) GTEST_SKIP() << "NVRTC does not run under AddressSanitizer";     \
    auto v_ = ::kc::nvrtc_version();                                                 \
    const char* req_ = std::getenv("KERNELCRAFT_REQUIRE_NVRTC");                     \
    if (!v_.is_ok() && req_ && std::string(req_) == "1")                            \
      FAIL() << "NVRTC required but not loadable: " << v_.status().to_string();      \
    if (!v_.is_ok()) GTEST_SKIP() << "NVRTC not loadable: " << v_.status().to_string(); \
  } while (0)
