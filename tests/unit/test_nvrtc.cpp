// NVRTC without a GPU: CUBINs for sm_90, compile errors with the log, and a clean "no CUDA" path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/cuda_backend.h"
#include "runtime/fsutil.h"
#include "runtime/subprocess.h"
#include "test_util.h"

namespace kc {
namespace {

const char* kRelu = R"J(
extern "C" __global__ void kc_relu(float* out, const float* in, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] > 0.f ? in[i] : 0.f;
}
)J";

TEST(Nvrtc, VersionLooksLikeMajorDotMinor) {
  SKIP_WITHOUT_NVRTC();
  std::string v = nvrtc_version().value();
  ASSERT_NE(v.find('.'), std::string::npos) << v;
  EXPECT_GE(std::stoi(v), 11) << v;
}

TEST(Nvrtc, CompilesACubinForSm90WithoutAGpu) {
  SKIP_WITHOUT_NVRTC();
  auto out = nvrtc_compile(kRelu, 90);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_GT(out->binary.size(), 64u);
  EXPECT_EQ(out->binary.compare(0, 4, "\x7f" "ELF"), 0);
  EXPECT_GT(out->millis, 0);
  // The entry name survives unmangled in the CUBIN's symbol table.
  EXPECT_NE(out->binary.find("kc_relu"), std::string::npos);
}

// LD_LIBRARY_PATH without its directories that hold an NVRTC: a machine whose own libraries come
// from there (a sysroot for RocksDB on the GPU machine) keeps them, but NVRTC is not found that way.
std::string library_path_without_nvrtc() {
  const char* v = std::getenv("LD_LIBRARY_PATH");
  std::stringstream in(v ? v : ""), out;
  std::string dir;
  while (std::getline(in, dir, ':')) {
    bool has_nvrtc = false;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      has_nvrtc |= it->path().filename().string().rfind("libnvrtc", 0) == 0;
    if (!dir.empty() && !has_nvrtc) out << (out.tellp() > 0 ? ":" : "") << dir;
  }
  return out.str();
}

// NVRTC must be found the way a fresh machine offers it: the pip wheel's libnvrtc and its builtins
// side by side in a directory the loader does not search, no LD_LIBRARY_PATH, no CUDA_HOME. The
// same compile runs again in a child whose environment is scrubbed to PATH alone (and the library
// path, less any directory with an NVRTC in it); it must pass there, not skip: a builtins lookup
// that only works through the environment fails this test.
TEST(Nvrtc, CompilesInAScrubbedEnvironment) {
  SKIP_WITHOUT_NVRTC();
  const std::string out = std::filesystem::temp_directory_path() / ("kc-nvrtc-child-" + std::to_string(getpid()) + ".txt");
  ProcessOptions o;
  o.timeout_s = 120;
  o.output_path = out;
  auto r = run_process({"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "KERNELCRAFT_REQUIRE_NVRTC=1",
                        "LD_LIBRARY_PATH=" + library_path_without_nvrtc(), self_exe(),
                        "--gtest_filter=Nvrtc.CompilesACubinForSm90WithoutAGpu"}, o);
  std::ifstream f(out);
  std::stringstream log;
  log << f.rdbuf();
  std::filesystem::remove(out);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->ok()) << log.str();
  EXPECT_NE(log.str().find("[  PASSED  ] 1 test"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("SKIPPED"), std::string::npos) << log.str();
}

TEST(Nvrtc, SyntaxErrorIsACompileErrorWithTheLog) {
  SKIP_WITHOUT_NVRTC();
  auto out = nvrtc_compile("extern \"C\" __global__ void k(float* x) { x[0] = ; }\n", 90);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), Code::kCompileError);
  EXPECT_NE(out.status().message().find("kernel.cu"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("error"), std::string::npos) << out.status().message();
}

TEST(Nvrtc, UnknownArchitectureIsUnsupported) {
  SKIP_WITHOUT_NVRTC();
  auto out = nvrtc_compile(kRelu, 12);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), Code::kUnsupported) << out.status().to_string();
}

TEST(Nvrtc, Cpp17IsOn) {
  SKIP_WITHOUT_NVRTC();
  auto out = nvrtc_compile(R"J(
template <int N> __device__ constexpr int twice() { if constexpr (N > 0) return 2 * N; else return 0; }
extern "C" __global__ void k(int* x) { x[0] = twice<3>(); }
)J", 90);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
}

TEST(Nvrtc, HalfAndBfloat16HeadersFromTheToolkit) {
  SKIP_WITHOUT_NVRTC();
  auto out = nvrtc_compile(R"J(
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void k(__half* a, __nv_bfloat16* b) { a[0] = __float2half(1.f); b[0] = __float2bfloat16(2.f); }
)J", 90);
  if (!out.is_ok() && out.status().message().find("cuda_fp16.h") != std::string::npos)
    GTEST_SKIP() << "no CUDA include directory with cuda_fp16.h here";
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
}

// This machine has no driver: the probe and the backend must say so without crashing, every time.
TEST(CudaBackend, UnavailableWithoutADriverIsClean) {
  Status s = cuda_available(0);
  auto b = cuda_backend(0);
  EXPECT_EQ(s.is_ok(), b.is_ok());
  if (b.is_ok()) GTEST_SKIP() << "a CUDA device is present: " << b.value()->target_id();
  EXPECT_EQ(b.status().code(), Code::kUnavailable) << b.status().to_string();
  EXPECT_EQ(s.code(), Code::kUnavailable);
  auto again = cuda_backend(0);
  EXPECT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().message(), b.status().message());
  EXPECT_FALSE(cuda_backend(-1).is_ok());
}

// Every CUDA source the project ships compiles with NVRTC for sm_90 (no GPU needed).
TEST(Nvrtc, EveryShippedCudaSourceCompiles) {
  SKIP_WITHOUT_NVRTC();
  namespace fs = std::filesystem;
  int n = 0;
  for (const char* dir : {"examples/kernels", "evolve/kernels"}) {
    fs::path root = fs::path(KC_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.path().extension() != ".cu") continue;
      std::ifstream f(e.path());
      std::stringstream ss;
      ss << f.rdbuf();
      auto out = nvrtc_compile(ss.str(), 90);
      ASSERT_TRUE(out.is_ok()) << e.path() << ": " << out.status().to_string();
      EXPECT_GT(out->binary.size(), 0u) << e.path();
      ++n;
    }
  }
  EXPECT_GE(n, 1) << "no .cu files found under examples/kernels or evolve/kernels";
}

}  // namespace
}  // namespace kc
