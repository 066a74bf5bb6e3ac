// The CPU binary check: honest kernels pass; unlisted imports, load-time code and system calls are
// refused with the specific reason, also by the backend's load (before dlopen could run anything).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/binary_check.h"
#include "runtime/cpu_backend.h"

namespace kc {
namespace {

namespace fs = std::filesystem;

std::string build(const std::string& src, const std::vector<std::string>& extra = {}) {
  auto out = cpu_compile(src, extra);
  EXPECT_TRUE(out) << out.status().to_string();
  return out ? out->binary : std::string();
}

// A correct relu body, so every defect below is "an honest kernel plus one thing".
const char* kRelu = R"(
extern "C" void kc_relu(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* in = KC_ARG(const float*, args, 1);
  for (int64_t i = ctx->begin; i < ctx->end; ++i) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}
)";

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(BinaryCheck, EveryHonestCorpusKernelAndTheExamplePass) {
  std::vector<fs::path> files = {fs::path(KC_SOURCE_DIR) / "examples/kernels/relu_cpu.cpp"};
  for (const auto& e : fs::directory_iterator(fs::path(KC_SOURCE_DIR) / "tests/corpus/cpu"))
    if (e.path().filename().string().rfind("honest_", 0) == 0 && e.path().extension() == ".cpp") files.push_back(e.path());
  ASSERT_GE(files.size(), 10u);
  for (const auto& f : files) {
    std::string bin = build(read(f));
    BinaryCheck c = check_cpu_binary(bin);
    EXPECT_TRUE(c.ok()) << f.filename() << ": " << c.message();
  }
}

TEST(BinaryCheck, UnlistedLibcCallsThroughPrototypesAreImports) {
  struct Case { const char* src; const char* symbol; } cases[] = {
      {"extern \"C\" int unlink(const char*);\n", "unlink"},
      {"extern \"C\" int mkdir(const char*, unsigned);\n", "mkdir"},
      // token pasting: no "system(" anywhere in the source for a rule to find
      {"#define KC_CAT(a, b) a##b\nextern \"C\" int KC_CAT(sys, tem)(const char*);\n", "system"},
  };
  for (const auto& c : cases) {
    std::string caller = std::string(c.src) + kRelu +
                         "extern \"C\" void kc_side(const kc_cpu_ctx*, void* const*) { " + c.symbol +
                         (std::string(c.symbol) == "mkdir" ? "(\"/nonexistent/kc\", 0); }" : "(\"/nonexistent/kc\"); }");
    BinaryCheck r = check_cpu_binary(build(caller));
    EXPECT_EQ(r.fault, BinaryFault::kImport) << c.symbol << ": " << r.message();
    EXPECT_EQ(r.detail, c.symbol);
    EXPECT_NE(r.message().find(c.symbol), std::string::npos);
  }
}

TEST(BinaryCheck, ConstructorsDestructorsAndInitHooksAreRefused) {
  const char* cases[] = {
      "__attribute__((constructor)) static void kc_ctor() { __builtin_trap(); }\n",
      "__attribute__((constructor(101))) static void kc_ctor() { __builtin_trap(); }\n",
      "__attribute__((destructor(65535))) static void kc_dtor() { __builtin_trap(); }\n",
      "static void kc_hook() { __builtin_trap(); }\n"
      "__attribute__((section(\".init_array\"), used)) static void (*kc_p)() = kc_hook;\n",
      "extern \"C\" void _init() { __builtin_trap(); }\n",   // ld makes this DT_INIT
      "extern \"C\" void _fini() { __builtin_trap(); }\n",
  };
  for (const char* pre : cases) {
    std::string bin = build(std::string(pre) + kRelu);
    BinaryCheck r = check_cpu_binary(bin);
    EXPECT_EQ(r.fault, BinaryFault::kConstructor) << pre << r.message();
    // If dlopen ran the hook the test process would die of SIGILL here.
    ResolvedSpec spec;
    auto ld = cpu_backend().load(bin, spec);
    ASSERT_FALSE(ld.is_ok());
    EXPECT_NE(ld.status().message().find("runs code at load or unload"), std::string::npos) << ld.status().to_string();
  }
}

TEST(BinaryCheck, IfuncResolversAreRefused) {
  std::string src = std::string(kRelu) +
                    "extern \"C\" void kc_impl() {}\n"
                    "extern \"C\" void (*kc_resolve())() { return kc_impl; }\n"
                    "extern \"C\" void kc_chosen() __attribute__((ifunc(\"kc_resolve\")));\n";
  BinaryCheck r = check_cpu_binary(build(src));
  EXPECT_EQ(r.fault, BinaryFault::kIfunc) << r.message();
}

TEST(BinaryCheck, SystemCallInstructionsAreFoundByDisassembly) {
  struct Case { const char* insn; const char* mnemonic; } cases[] = {
      {"syscall", "syscall"}, {"sysenter", "sysenter"}, {"int $0x80", "int"}};
  for (const auto& c : cases) {
    std::string src = std::string(kRelu) + "extern \"C\" long kc_raw(long n) { long r; asm volatile(\"" + c.insn +
                      "\" : \"=a\"(r) : \"a\"(n) : \"rcx\", \"r11\", \"memory\"); return r; }\n";
    BinaryCheck r = check_cpu_binary(build(src));
    EXPECT_EQ(r.fault, BinaryFault::kSyscall) << c.insn << ": " << r.message();
    EXPECT_EQ(r.detail.rfind(c.mnemonic, 0), 0u) << r.detail;
    EXPECT_EQ(r.section, ".text");
    EXPECT_EQ(r.function.rfind("kc_raw+0x", 0), 0u) << r.function;
    EXPECT_GT(r.offset, 0u);
    EXPECT_EQ(r.to_json()["fault"], "syscall");
  }
}

TEST(BinaryCheck, SyscallBytesInsideAnotherInstructionAreNotASyscall) {
  // mov $0x050f, %eax encodes as b8 0f 05 00 00: a byte scan for 0f 05 would refuse it.
  std::string src = std::string(kRelu) + "extern \"C\" int kc_mov() { int r; asm(\"movl $0x050f, %0\" : \"=r\"(r)); return r; }\n";
  std::string bin = build(src);
  EXPECT_NE(bin.find("\x0f\x05"), std::string::npos) << "the pattern must be in the binary for this test to mean anything";
  BinaryCheck r = check_cpu_binary(bin);
  EXPECT_TRUE(r.ok()) << r.message();
}

TEST(BinaryCheck, ExecutableStackIsRefused) {
  BinaryCheck r = check_cpu_binary(build(kRelu, {"-Wl,-z,execstack"}));
  EXPECT_EQ(r.fault, BinaryFault::kExecutableStack) << r.message();
}

TEST(BinaryCheck, SanitizerBuildsPassOnlyUnderTheirPolicy) {
  std::string bin = build(kRelu, {"-fsanitize=address", "-fno-omit-frame-pointer", "-g"});
  BinaryCheck strict = check_cpu_binary(bin);
  EXPECT_FALSE(strict.ok());
  BinaryCheck relaxed = check_cpu_binary(bin, BinaryPolicy::kSanitizerBuild);
  EXPECT_TRUE(relaxed.ok()) << relaxed.message();
  // ...but a syscall is refused in sanitizer builds too.
  std::string sys = std::string(kRelu) + "extern \"C\" void kc_raw() { asm volatile(\"syscall\" ::: \"rax\", \"rcx\", \"r11\"); }\n";
  BinaryCheck r = check_cpu_binary(build(sys, {"-fsanitize=address"}), BinaryPolicy::kSanitizerBuild);
  EXPECT_EQ(r.fault, BinaryFault::kSyscall) << r.message();
}

TEST(BinaryCheck, GarbageIsMalformedNotACrash) {
  std::string bin = build(kRelu);
  for (size_t n : {size_t(0), size_t(4), size_t(64), bin.size() / 2})
    EXPECT_EQ(check_cpu_binary(bin.substr(0, n)).fault, BinaryFault::kMalformed) << n;
  std::string flipped = bin;
  for (size_t i = 64; i < flipped.size(); i += 7) flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
  EXPECT_FALSE(check_cpu_binary(flipped).ok());
}

TEST(BinaryCheck, TheSameSourceBuildsToTheSameBytes) {
  // Each compile runs in its own temp dir; bundle import compares the hash of a rebuild.
  EXPECT_EQ(build(kRelu), build(kRelu));
}

}  // namespace
}  // namespace kc
