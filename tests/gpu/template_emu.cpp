// The host emulation of CUDA template kernels (template_emu.h).
#include "tests/gpu/template_emu.h"

#include <dlfcn.h>

#include <cstdlib>
#include <regex>
#include <vector>

#include "runtime/fsutil.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"

namespace kc::evolve::gpu_run {
namespace {

// The CUDA builtins the emulatable templates use, as host C++. Thread and block indices are
// plain globals: the launcher runs one thread at a time. The fast intrinsics are their exact
// functions (the emulation checks the logic; their error is the GPU tests' and the verifier's).
const char* kShim = R"CC(#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
struct kc_emu_dim3 { unsigned x, y, z; };
static kc_emu_dim3 threadIdx, blockIdx, gridDim, blockDim;
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
#define __expf expf   // glibc declares functions of these names: the CUDA ones are macros here
#define __logf logf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.f / x; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsqrt_rn(float x) { return std::sqrt(x); }
static inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class A, class B> static inline auto min(A a, B b) { return b < a ? b : a; }
template <class A, class B> static inline auto max(A a, B b) { return a < b ? b : a; }
// cuLaunchKernel's kernelParams: args[i] points at the i-th parameter's value.
template <class... P, std::size_t... I>
static void kc_emu_apply(void (*f)(P...), void* const* a, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<P>*>(a[I])...);
}
template <class... P> static void kc_emu_call(void (*f)(P...), void* const* a) {
  kc_emu_apply(f, a, std::index_sequence_for<P...>{});
}
)CC";

// Constructs whose meaning depends on threads running together, or that the host cannot compile.
const char* const kRefused[] = {"__shared__", "__syncthreads", "__syncwarp", "__shfl", "__ballot", "__any_sync",
                                "__all_sync", "__match", "__activemask", "atomic", "asm(", "asm volatile", "cooperative_groups"};

std::vector<std::string> entries_of(const std::string& src) {
  static const std::regex re(R"(extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\()");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

// The source the host compiles: the shim, each entry renamed so a wrapper of the CPU kernel's
// shape can take its name, the kernel, then per entry a loop over every block and thread.
std::string emulated_source(const std::string& src) {
  std::string pre = kShim, post;
  for (const std::string& e : entries_of(src)) {
    pre += "#define " + e + " kc_cu_" + e + "\n";
    post += "#undef " + e + "\nextern \"C\" void kc_emu_" + e + R"CC((const long long* d, void* const* a) {
  gridDim = {(unsigned)d[0], (unsigned)d[1], (unsigned)d[2]};
  blockDim = {(unsigned)d[3], (unsigned)d[4], (unsigned)d[5]};
  for (unsigned bz = 0; bz < gridDim.z; ++bz) for (unsigned by = 0; by < gridDim.y; ++by) for (unsigned bx = 0; bx < gridDim.x; ++bx)
    for (unsigned tz = 0; tz < blockDim.z; ++tz) for (unsigned ty = 0; ty < blockDim.y; ++ty) for (unsigned tx = 0; tx < blockDim.x; ++tx) {
      blockIdx = {bx, by, bz};
      threadIdx = {tx, ty, tz};
      kc_emu_call(&kc_cu_)CC" + e + R"CC(, a);
    }
}
)CC";
  }
  return pre + "#line 1 \"kernel.cu\"\n" + src + "\n" + post;
}

using EmuEntry = void (*)(const long long*, void* const*);

class EmuLauncher : public Launcher {
 public:
  EmuLauncher(void* handle, std::vector<EmuEntry> fns, ResolvedSpec spec)
      : handle_(handle), fns_(std::move(fns)), spec_(std::move(spec)) {}
  ~EmuLauncher() override { dlclose(handle_); }

  Status run(void* const* ptrs, const ExecContext&) override {
    for (size_t i = 0; i < spec_.launches.size(); ++i) {
      const ResolvedLaunch& l = spec_.launches[i];
      std::vector<Param> vals = l.params;
      std::vector<void*> slots(vals.size()), args(vals.size());
      for (size_t j = 0; j < vals.size(); ++j) {
        if (vals[j].kind == Param::Kind::kPtr) {
          slots[j] = ptrs[vals[j].slot];
          args[j] = &slots[j];
        } else {
          args[j] = &vals[j].imm;   // the union's first bytes hold the value of its kind
        }
      }
      const long long dims[6] = {l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2]};
      fns_[i](dims, args.data());
    }
    return Status::ok();
  }

 private:
  void* handle_;
  std::vector<EmuEntry> fns_;
  ResolvedSpec spec_;
};

class EmuBackend : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string target_id() const override { return "cuda-host-emulation"; }

  Result<CompileOutput> compile(const std::string& source) override {
    if (std::string why = emu_refusal(source); !why.empty()) return Status::error(Code::kUnsupported, why);
    ScopedTempDir dir("emu");
    if (!dir.ok()) return Status::error(Code::kIOError, "no temp dir for the emulation");
    const std::string src = dir.file("kernel.cpp"), so = dir.file("kernel.so"), log = dir.file("compile.log");
    if (!write_file(src, emulated_source(source))) return Status::error(Code::kIOError, "cannot write " + src);
    const char* cxx = std::getenv("KERNELCRAFT_CXX");
    ProcessOptions po;
    po.timeout_s = 120;
    po.output_path = log;
    auto r = run_process({cxx && *cxx ? cxx : "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o", so, src}, po);
    if (!r.is_ok()) return r.status();
    CompileOutput out;
    out.log = read_file(log);
    out.binary = read_file(so);
    if (!r->ok() || out.binary.empty()) return Status::error(Code::kCompileError, "host compile of the emulation failed:\n" + out.log);
    return out;
  }

  Result<std::unique_ptr<Launcher>> load(const std::string& binary, const ResolvedSpec& spec) override {
    ScopedTempDir dir("emu");
    const std::string so = dir.file("kernel.so");
    if (!dir.ok() || !write_file(so, binary)) return Status::error(Code::kIOError, "cannot write the emulation object");
    void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);   // mapped: the file may go with the dir
    if (!h) return Status::error(Code::kLaunchError, std::string("dlopen: ") + dlerror());
    std::vector<EmuEntry> fns;
    for (const ResolvedLaunch& l : spec.launches) {
      auto f = reinterpret_cast<EmuEntry>(dlsym(h, ("kc_emu_" + l.entry).c_str()));
      if (!f) {
        dlclose(h);
        return Status::error(Code::kLaunchError, "no entry " + l.entry + " in the emulation");
      }
      fns.push_back(f);
    }
    return std::unique_ptr<Launcher>(new EmuLauncher(h, std::move(fns), spec));
  }
};

}  // namespace

std::string emu_refusal(const std::string& source) {
  for (const char* r : kRefused)
    if (source.find(r) != std::string::npos) return std::string("uses ") + r;
  return "";
}

Backend& emu_backend() {
  static EmuBackend b;
  return b;
}

}  // namespace kc::evolve::gpu_run
