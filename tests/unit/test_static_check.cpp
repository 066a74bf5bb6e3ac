// The static source check: every rule fires on a small positive example and stays quiet on honest
// kernels (the shipped relu examples, const tables, comments and strings naming forbidden things);
// the defect corpus (tests/corpus) gets the verdicts its manifest expects from this stage, and its
// CUDA kernels compile with NVRTC.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "evolve/verify/preprocess.h"
#include "evolve/verify/static_check.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string src(const char* rel) { return slurp(std::filesystem::path(KC_SOURCE_DIR) / rel); }

StaticReport cuda(const std::string& s, int64_t numel = 1 << 20, const std::string& policy = "fp32") {
  return static_check(s, BackendKind::kCuda, policy, {"f32"}, numel);
}
StaticReport cpu(const std::string& s, int64_t numel = 1 << 20) { return static_check(s, BackendKind::kCpu, "fp32", {"f32"}, numel); }

// The severity of `rule`'s finding, "" if it did not fire.
std::string sev(const StaticReport& r, const std::string& rule) {
  std::string out;
  for (const auto& f : r.findings)
    if (f.rule == rule && (out.empty() || f.severity == "error")) out = f.severity;
  return out;
}

#define EXPECT_ERROR(report, rule) \
  do { auto r_ = (report); EXPECT_EQ(sev(r_, rule), "error") << r_.to_json().dump(1); EXPECT_FALSE(r_.ok()); } while (0)
#define EXPECT_WARNING(report, rule) \
  do { auto r_ = (report); EXPECT_EQ(sev(r_, rule), "warning") << r_.to_json().dump(1); } while (0)
#define EXPECT_CLEAN(report) \
  do { auto r_ = (report); EXPECT_TRUE(r_.findings.empty()) << r_.to_json().dump(1); } while (0)

TEST(StaticCheck, ShippedReluExamplesAreClean) {
  EXPECT_CLEAN(cuda(src("examples/kernels/relu_cuda.cu")));
  EXPECT_CLEAN(cpu(src("examples/kernels/relu_cpu.cpp")));
}

TEST(StaticCheck, HonestIdiomsAreClean) {
  EXPECT_CLEAN(cuda(R"K(
// A constant table, restrict pointers, dynamic shared memory, a warp reduction. __expf is
// mentioned here in a comment and "clock64() createpolicy __half" in a string: neither counts.
__device__ const float kTable[4] = {1.f, 2.f, 3.f, 4.f};
__constant__ float kC[2] = {0.5f, 0.25f};
static __device__ constexpr int kWarp = 32;
extern __shared__ float smem[];
/* static int leftover = 0; __managed__ int m; */
template <int N = 4> __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
extern "C" __global__ void __launch_bounds__(256) k(float* __restrict__ out, const float* __restrict__ x, long long n) {
  __shared__ float part[32];
  const char* msg = "static int x; __expf(1) %globaltimer";
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float y = i < n ? expf(x[i]) * kTable[i & 3] + kC[0] : 0.f;
  int half = blockDim.x / 2;
  part[threadIdx.x & 31] = warp_sum(y) + half + kWarp;
  if (i < n) out[i] = y + (msg[0] == 's');
}
)K"));
  EXPECT_CLEAN(cpu(R"K(
#include <math.h>
#include <algorithm>
static const float kTable[3] = {1.f, 2.f, 3.f};
static inline float sq(float v) { return v * v; }
namespace { constexpr int kVec = 8; }
struct Acc { float s; int n; };
extern "C" void k(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  static const double kLn2 = 0.6931471805599453;   // const: fine
  Acc a = {0.f, 0};
  for (int64_t b = ctx->begin; b < ctx->end; ++b) { a.s += sq((float)b) * kTable[b % 3] * kVec; ++a.n; }
  out[0] = a.s + (float)kLn2 + std::max(1'000, 2);  // digit separators are not char literals
  const char* s = "fopen getenv(\"x\") clock()";
  (void)s;
}
)K"));
}

TEST(StaticCheck, DeviceStateSurvivingLaunches) {
  EXPECT_ERROR(cuda("__device__ int calls = 0;\nextern \"C\" __global__ void k(float* o) { o[0] = calls++; }\n"), "device-state");
  EXPECT_ERROR(cuda("__managed__ float cache[1024];\n"), "device-state");
  EXPECT_ERROR(cuda("__device__ const float* last_input;\n"), "device-state");    // the pointer itself mutable
  EXPECT_ERROR(cuda("namespace a { __device__ unsigned flag{0}; }\n"), "device-state");
  EXPECT_ERROR(cuda("extern \"C\" __global__ void k(float* o) {\n  static int n = 0;\n  o[0] = ++n;\n}\n"), "device-state");
  EXPECT_ERROR(cpu("static float cache[4096];\nextern \"C\" void k(const kc_cpu_ctx* c, void* const* a) {}\n"), "device-state");
  EXPECT_ERROR(cpu("int64_t calls;\n"), "device-state");
  EXPECT_ERROR(cpu("extern \"C\" void k(const kc_cpu_ctx* c, void* const* a) {\n  static int n = 0;\n  ++n;\n}\n"),
               "device-state");
  EXPECT_ERROR(cpu("extern \"C\" void k(const kc_cpu_ctx* c, void* const* a) {\n  thread_local float last[8];\n}\n"),
               "device-state");
  // The finding names the line of the declaration.
  auto r = cuda("// header\n\n__device__ int calls;\n");
  ASSERT_EQ(r.findings.size(), 1u) << r.to_json().dump(1);
  EXPECT_EQ(r.findings[0].line, 3);
  EXPECT_EQ(r.findings[0].text, "__device__ int calls;");
}

TEST(StaticCheck, PrecisionThePolicyForbids) {
  EXPECT_ERROR(cuda("__device__ float f(float x) { __half h = __float2half(x); return __half2float(h); }\n"), "reduced-precision");
  EXPECT_ERROR(cuda("__device__ float f(float a, float b) { return __bfloat162float(__float2bfloat16(a)); }\n"), "reduced-precision");
  EXPECT_ERROR(cuda("__device__ float f(float x) { unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x)); return 0; }\n"),
               "reduced-precision");
  EXPECT_ERROR(cpu("static inline float f(float x) { _Float16 h = x; return h; }\n"), "reduced-precision");
  EXPECT_ERROR(cuda("__device__ void f() { wmma::fragment<int, 16, 16, 16, float> a; }\n"), "tensor-core");
  EXPECT_ERROR(cuda("__device__ void f() { asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ...\"); }\n"), "tensor-core");
  EXPECT_ERROR(cuda("__device__ float f(float x) { return __expf(x) + __fdividef(x, 3.f); }\n"), "fast-math");
  EXPECT_ERROR(cuda("__device__ float f(float x) { float y; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y; }\n"),
               "fast-math");
  EXPECT_ERROR(cpu("#pragma GCC optimize(\"fast-math\")\n"), "fast-math");
  EXPECT_ERROR(cpu("__attribute__((optimize(\"Ofast\"))) static float f(float x) { return x; }\n"), "fast-math");
  EXPECT_ERROR(cpu("#include <immintrin.h>\nstatic void f() { _mm_setcsr(_mm_getcsr() | 0x8040); }\n"), "fast-math");
  // Rounded intrinsics are exact; standard math functions are fine.
  EXPECT_CLEAN(cuda("__device__ float f(float x) { return __frcp_rn(x) + __fdiv_rn(x, 3.f) + rsqrtf(x) + tanhf(x); }\n"));
  // Reduced precision is allowed where the data is half or the policy says so.
  EXPECT_TRUE(static_check("#include <cuda_fp16.h>\n__device__ float f(__half h) { return __half2float(h); }\n", BackendKind::kCuda, "fp32",
                           {"f16"}, 100).ok());
  EXPECT_TRUE(static_check("__device__ float f(float a) { return __bfloat162float(__float2bfloat16(a)); }\n", BackendKind::kCuda, "bf16",
                           {"f32"}, 100).ok());
  EXPECT_TRUE(static_check("__device__ void f() { wmma::fragment<int, 16, 16, 16, float> a; }\n", BackendKind::kCuda, "tf32", {"f32"}, 100).ok());
}

TEST(StaticCheck, ClocksAndAsm) {
  EXPECT_ERROR(cuda("extern \"C\" __global__ void k(long long* o) { o[0] = clock64(); }\n"), "timer");
  EXPECT_ERROR(cuda("__device__ unsigned long long t() { unsigned long long v; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(v)); return v; }\n"),
               "timer");
  EXPECT_ERROR(cpu("#include <time.h>\nstatic long f() { return (long)clock(); }\n"), "timer");
  EXPECT_ERROR(cpu("static unsigned long long f() { return __rdtsc(); }\n"), "timer");
  EXPECT_WARNING(cuda("__device__ void f() { __nanosleep(100); }\n"), "sleep");
  auto r = cuda("__device__ float f(float x) { float y; asm(\"mov.b32 %0, %1;\" : \"=f\"(y) : \"f\"(x)); return y; }\n");
  EXPECT_WARNING(r, "inline-asm");
  EXPECT_TRUE(r.ok()) << r.to_json().dump(1);
}

TEST(StaticCheck, L2Residency) {
  EXPECT_ERROR(cuda("__device__ void f(const float* p) { unsigned long long pol;\n"
                    "  asm volatile(\"createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\" : \"=l\"(pol)); }\n"),
               "l2-residency");
  EXPECT_ERROR(cuda("__device__ void f(const float* p) { float v; asm(\"ld.global.L2::evict_last.f32 %0, [%1];\" : \"=f\"(v) : \"l\"(p)); }\n"),
               "l2-residency");
  EXPECT_ERROR(cuda("void f() { cudaAccessPolicyWindow w; }\n"), "l2-residency");
  EXPECT_WARNING(cuda("__device__ void f(const float* p) { asm(\"prefetch.global.L2 [%0];\" :: \"l\"(p)); }\n"), "l2-prefetch");
}

TEST(StaticCheck, Int32IndexDependsOnTheCallsSize) {
  const char* k = "extern \"C\" __global__ void k(float* o, const float* x, long long n) {\n"
                  "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) o[i] = x[i];\n}\n";
  EXPECT_WARNING(cuda(k, 1000 * 33), "int32-index");
  EXPECT_TRUE(cuda(k, 1000 * 33).ok());
  EXPECT_ERROR(cuda(k, 46341LL * 46341), "int32-index");
  // 64-bit variables are fine when widened before the multiply; a 32-bit product wraps at 2^32.
  EXPECT_CLEAN(cuda("__global__ void k() { long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; }\n", 1LL << 33));
  EXPECT_ERROR(cuda("__global__ void k() { size_t i = blockIdx.x * blockDim.x + threadIdx.x; }\n", 1LL << 33), "int32-index");
  EXPECT_WARNING(cuda("__global__ void k() { size_t i = blockIdx.x * blockDim.x + threadIdx.x; }\n", 1LL << 31), "int32-index");
  EXPECT_CLEAN(cuda("__global__ void k() { int row = blockIdx.x; int stride = blockDim.x * gridDim.x; }\n", 1LL << 33));
}

TEST(StaticCheck, HostThingsDeviceCodeMustNotDo) {
  EXPECT_ERROR(cpu("#include <pthread.h>\n"), "include");
  EXPECT_ERROR(cpu("#include \"torch/extension.h\"\n"), "include");
  EXPECT_TRUE(cuda("#include <cooperative_groups.h>\n").ok());
  EXPECT_CLEAN(cpu("#include <math.h>\n#include <cstring>\n#include <limits>\n"));
  // Headers of plain computation are fine out of habit; what the kernel does with them is judged.
  EXPECT_CLEAN(cpu("#include <vector>\n#include <atomic>\n#include <numeric>\n#include <cstdlib>\n"));
  EXPECT_ERROR(cpu("#include <thread>\n"), "include");
  EXPECT_ERROR(cpu("#include <fstream>\n"), "include");
  EXPECT_ERROR(cpu("#include <cstdlib>\nstatic const char* f() { return getenv(\"X\"); }\n"), "host-call");
  EXPECT_TRUE(cuda("#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n").ok()) << "including is not using";
  EXPECT_ERROR(cuda("#include <cuda_fp16.h>\n__device__ float f(float x) { return __half2float(__float2half(x)); }\n"),
               "reduced-precision");   // fp32 policy on fp32 data
  EXPECT_ERROR(cuda("#include <cuda_runtime.h>\n__global__ void k(float* p) { cudaMalloc((void**)&p, 4); }\n"),
               "host-call");
  EXPECT_ERROR(cuda("#include <cstdio>\n"), "include");
  for (const char* call : {"pthread_create(0, 0, 0, 0);", "std::thread t;", "fork();", "system(\"ls\");",
                           "dlopen(0, 0);", "fopen(\"/proc/self/maps\", \"r\");", "getenv(\"X\");",
                           "mmap(0, 0, 0, 0, 0, 0);", "syscall(1);"}) {
    SCOPED_TRACE(call);
    EXPECT_ERROR(cpu(std::string("static void f() { ") + call + " }\n"), "host-call");
  }
  EXPECT_ERROR(cpu("extern int at_harness_state;\n"), "host-call");
  EXPECT_ERROR(cpu("__attribute__((constructor)) static void init() {}\n"), "host-call");
  EXPECT_WARNING(cpu("static void f() { float* p = (float*)malloc(64); free(p); }\n"), "alloc");
  EXPECT_WARNING(cpu("static void f() { float* p = new float[4]; delete[] p; }\n"), "alloc");
  EXPECT_ERROR(cuda("__global__ void c() {}\n__global__ void k() { c<<<1, 1>>>(); }\n"), "host-call");
  EXPECT_ERROR(cuda("__global__ void k() { cudaStream_t s; cudaMalloc(0, 4); }\n"), "host-call");
  EXPECT_ERROR(cuda("__global__ void k() { cooperative_groups::this_grid().sync(); }\n"), "grid-sync");
}

TEST(StaticCheck, CommentsStringsAndSplicesNeitherTriggerNorHide) {
  EXPECT_CLEAN(cuda("// __device__ int calls;\n/* __expf( clock64() */\nconst char* s = \"__managed__ int x; evict_last\";\n"));
  EXPECT_CLEAN(cuda("const char* s = R\"raw(__device__ int x; \" __expf( )raw\";\n"));
  EXPECT_CLEAN(cuda("const char c = '\"'; // \"__expf(\"\n"));
  // A line splice inside an identifier is still that identifier, reported at its first line.
  auto r = cuda("__device__ float f(float x) {\n  return __ex\\\npf(x);\n}\n");
  EXPECT_EQ(sev(r, "fast-math"), "error") << r.to_json().dump(1);
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].line, 2);
  // A comment cannot hide code after it on the same line.
  EXPECT_ERROR(cuda("/* harmless */ __device__ int calls; // more\n"), "device-state");
}

TEST(StaticCheck, JsonReport) {
  auto j = cuda("__device__ int calls;\n__device__ void f() { __nanosleep(1); }\n").to_json();
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["errors"].get<int>(), 1);
  EXPECT_EQ(j["warnings"].get<int>(), 1);
  ASSERT_EQ(j["findings"].size(), 2u);
  for (const char* k : {"rule", "severity", "line", "text", "why"}) EXPECT_TRUE(j["findings"][0].contains(k)) << k;
}

// ---- The defect corpus (tests/corpus/manifest.json): what this stage owes it.

nlohmann::json manifest() { return nlohmann::json::parse(src("tests/corpus/manifest.json")); }

std::filesystem::path corpus_file(const nlohmann::json& e, const char* ext) {
  const std::string b = e["backend"].get<std::string>();
  return std::filesystem::path(KC_SOURCE_DIR) / "tests/corpus" / b /
         (e["name"].get<std::string>() + (std::string(ext) == "src" ? (b == "cuda" ? ".cu" : ".cpp") : ext));
}

int64_t max_numel(const nlohmann::json& e) {
  int64_t m = 0;
  for (const auto& s : e["shapes"]) {
    int64_t n = 1;
    for (const auto& d : s) n *= d.get<int64_t>();
    m = std::max(m, n);
  }
  return m;
}

TEST(StaticCheckCorpus, HonestKernelsHaveNoErrorsAndStaticDefectsAreRejected) {
  int honest = 0, static_defects = 0;
  for (const auto& e : manifest()) {
    const std::string name = e["name"];
    const BackendKind b = backend_from_name(e["backend"].get<std::string>()).value();
    // As the gauntlet's static stage does: the raw source, then the source with macros expanded.
    const std::string raw = slurp(corpus_file(e, "src"));
    auto r = static_check(raw, b, "fp32", {"f32"}, max_numel(e));
    auto expanded = expand_macros(raw);
    ASSERT_TRUE(expanded.is_ok()) << name << ": " << expanded.status().to_string();
    if (r.ok()) r = static_check(expanded.value(), b, "fp32", {"f32"}, max_numel(e));
    if (e["expect"] == "pass") {
      EXPECT_TRUE(r.ok()) << name << ": " << r.to_json().dump(1);
      ++honest;
    } else if (e.value("stage", "") == "static") {
      EXPECT_FALSE(r.ok()) << name << " should be rejected by the static check";
      ++static_defects;
    }
    auto spec = parse_launch_spec(nlohmann::json::parse(slurp(corpus_file(e, ".json"))));
    EXPECT_TRUE(spec.is_ok()) << name << ": " << spec.status().to_string();
  }
  EXPECT_GE(honest, 10);
  EXPECT_GE(static_defects, 4);
}

TEST(StaticCheckCorpus, EveryCudaKernelCompilesWithNvrtc) {
  if (!nvrtc_version().is_ok()) GTEST_SKIP() << "NVRTC not loadable";
  int n = 0;
  for (const auto& e : manifest()) {
    if (e["backend"] != "cuda") continue;
    auto out = nvrtc_compile(slurp(corpus_file(e, "src")), 90);
    EXPECT_TRUE(out.is_ok()) << e["name"] << ": " << out.status().to_string();
    ++n;
  }
  EXPECT_GE(n, 20);
}

}  // namespace
}  // namespace kc::evolve

namespace kc::evolve {
namespace {

// An include names a header; only using what it declares is judged (issue: <mma.h> alone in an
// honest fp32 kernel was rejected as tensor-core).
TEST(StaticCheck, AnIncludeAloneIsNotUse) {
  const std::string honest = "#include <mma.h>\n__global__ void k(float* o) { o[threadIdx.x] = 1.0f; }\n";
  EXPECT_TRUE(cuda(honest).ok()) << cuda(honest).to_json().dump();
  EXPECT_FALSE(cuda("#include <mma.h>\n__device__ void f() { wmma::fragment<int, 16, 16, 16, float> a; }\n").ok());
  EXPECT_FALSE(cuda("#include <not_a_kernel_header.h>\n__global__ void k() {}\n").ok()) << "the allowlist still holds";
}

// State that outlives a launch declared in PTX rather than in C++: a module-scope .global (or
// .const written through a generic pointer, which is not possible) variable in inline asm.
TEST(StaticCheck, DeviceStateDeclaredInInlinePtxIsState) {
  EXPECT_FALSE(cuda("asm(\".global .align 8 .u64 kc_seen;\");\n__global__ void k(float* o) { o[0] = 1.0f; }\n").ok());
  EXPECT_FALSE(cuda("__global__ void k(float* o) { asm volatile(\".global .f32 memo[64];\"); o[0] = 1.0f; }\n").ok());
  // Registers and shared memory declared in PTX are per launch: not state.
  EXPECT_TRUE(cuda("__global__ void k(float* o) { float v; asm(\"{ .reg .f32 t; mov.f32 t, 1.0; mov.f32 %0, t; }\" : \"=f\"(v)); o[0] = v; }\n").ok())
      << cuda("__global__ void k(float* o) { float v; asm(\"{ .reg .f32 t; mov.f32 t, 1.0; mov.f32 %0, t; }\" : \"=f\"(v)); o[0] = v; }\n").to_json().dump();
}

// Macros expanded before the rules run: a memo declared through `#define PERSISTENT static` or a
// pasted `sta##tic` reads as what the compiler sees.
TEST(StaticCheck, MacrosAreExpandedBeforeTheRules) {
  const std::string hidden = "#include <cstdint>\n#define PERSISTENT static\n#define KEEP(a, b) a##b\n"
                             "PERSISTENT float memo[16];\nKEEP(sta, tic) int calls;\n"
                             "extern \"C\" void k(const void* ctx, void* const* args) { memo[0] += 1; ++calls; }\n";
  auto expanded = expand_macros(hidden);
  ASSERT_TRUE(expanded.is_ok()) << expanded.status().to_string();
  EXPECT_EQ(expanded.value().find("#include"), std::string::npos) << "includes are blanked, not expanded";
  EXPECT_NE(expanded.value().find("static float memo[16];"), std::string::npos) << expanded.value();
  EXPECT_NE(expanded.value().find("static int calls;"), std::string::npos) << expanded.value();
  StaticReport rep = static_check(expanded.value(), BackendKind::kCpu, "fp32", {"f32"}, 100);
  EXPECT_FALSE(rep.ok());
  EXPECT_NE(rep.first_error().find("device-state"), std::string::npos) << rep.first_error();
  EXPECT_EQ(expand_macros("#if\n").status().code(), Code::kCompileError) << "a source that does not preprocess";
}

}  // namespace
}  // namespace kc::evolve
