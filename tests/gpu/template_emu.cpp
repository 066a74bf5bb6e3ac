// The host emulation of CUDA template kernels (template_emu.h).
#include "tests/gpu/template_emu.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/config.h"
#include "runtime/fsutil.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"

namespace kc::evolve::gpu_run {
namespace {

// The CUDA builtins the templates use, as host C++. Thread and block indices are plain globals:
// one thread runs at a time. The fast intrinsics are their exact functions (the emulation checks
// the logic; their error is the GPU tests' and the verifier's). Atomics are plain read-modify-
// writes, which they are when threads never preempt each other.
const char* kShim = R"CC(#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <csetjmp>
#include <ucontext.h>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
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
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline void __threadfence() {}
#define __cluster_dims__(...)
static inline void __cluster_barrier_arrive() {}   // reached only with clusters of one block
static inline void __cluster_barrier_wait() {}
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __ldcg(const T* p) { return *p; }
template <class A, class B> static inline auto min(A a, B b) { return b < a ? b : a; }
template <class A, class B> static inline auto max(A a, B b) { return a < b ? b : a; }
template <class T, class U> static inline T atomicAdd(T* p, U v) { const T o = *p; *p = o + v; return o; }
template <class T, class U> static inline T atomicMax(T* p, U v) { const T o = *p; *p = o < v ? v : o; return o; }
template <class T, class U> static inline T atomicMin(T* p, U v) { const T o = *p; *p = v < o ? v : o; return o; }
template <class T, class U> static inline T atomicExch(T* p, U v) { const T o = *p; *p = v; return o; }
template <class T> static inline T atomicCAS(T* p, T c, T v) { const T o = *p; if (o == c) *p = v; return o; }
static inline float kc_emu_h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short kc_emu_f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h; }

// Threads that talk to each other (barriers, warp shuffles and votes) run as coroutines of one
// block: each runs until it waits, a warp is released when all its live lanes wait at a warp
// exchange, the block when all its live threads wait at __syncthreads. A warp exchange is two
// waits: every lane posts its value, then every lane reads its source's before any posts again.
namespace kc_emu {
enum State { kRun, kWarp, kBlock, kDone };
// A coroutine runs one CUDA thread of a block at a time and parks when it is done, to be resumed
// for the same thread of the next block: contexts are made once per slot (makecontext and
// setcontext cost system calls), every switch after that is a _setjmp / _longjmp.
struct Thread { jmp_buf jb; State st; kc_emu_dim3 idx; bool started; };
constexpr int kMaxThreads = 1024;
constexpr size_t kStack = 128 * 1024;
static Thread th[kMaxThreads];
static char* stacks = nullptr;
static ucontext_t start_ctx;
static jmp_buf sched;
static int nth = 0, cur = 0;
static unsigned long long posted[kMaxThreads];
static void (*body)(void* const*) = nullptr;
static void* const* body_args = nullptr;
static inline void wait(State s) {
  th[cur].st = s;
  if (!_setjmp(th[cur].jb)) _longjmp(sched, 1);
}
static void trampoline() {
  for (;;) {
    body(body_args);
    wait(kDone);
  }
}
static void resume(int i) {
  cur = i;
  threadIdx = th[i].idx;
  if (_setjmp(sched)) return;
  if (th[i].started) _longjmp(th[i].jb, 1);
  th[i].started = true;
  getcontext(&start_ctx);
  start_ctx.uc_stack.ss_sp = stacks + (size_t)i * kStack;
  start_ctx.uc_stack.ss_size = kStack;
  start_ctx.uc_link = nullptr;
  makecontext(&start_ctx, trampoline, 0);
  setcontext(&start_ctx);
}
static inline int lane() { return cur & 31; }
template <class T> static inline unsigned long long bits(T v) { unsigned long long b = 0; std::memcpy(&b, &v, sizeof(T)); return b; }
template <class T> static inline T from(unsigned long long b) { T v; std::memcpy(&v, &b, sizeof(T)); return v; }
// Posts v, then returns the value lane src of this warp posted (v itself if that lane is absent).
template <class T> static T exchange(T v, int src) {
  posted[cur] = bits(v);
  wait(kWarp);
  const int w = cur & ~31, s = w + src;
  const T got = src >= 0 && src < 32 && s < nth && th[s].st != kDone ? from<T>(posted[s]) : v;
  wait(kWarp);
  return got;
}
// The live lanes of this warp whose posted value satisfies pred(theirs).
template <class T, class P> static unsigned vote(T v, P pred) {
  posted[cur] = bits(v);
  wait(kWarp);
  unsigned m = 0;
  const int w = cur & ~31;
  for (int l = 0; l < 32 && w + l < nth; ++l)
    if (th[w + l].st != kDone && pred(from<T>(posted[w + l]))) m |= 1u << l;
  wait(kWarp);
  return m;
}
// Runs one block of nb threads; 0, or 1 if its threads wait on each other forever.
static int run_block(int nb) {
  if (!stacks) stacks = static_cast<char*>(std::malloc(kMaxThreads * kStack));
  nth = nb;
  for (int i = 0; i < nb; ++i) {
    th[i].st = kRun;
    th[i].idx = {(unsigned)(i % blockDim.x), (unsigned)(i / blockDim.x % blockDim.y), (unsigned)(i / (blockDim.x * blockDim.y))};
  }
  for (;;) {
    for (int i = 0; i < nb; ++i)
      if (th[i].st == kRun) resume(i);
    bool live = false, released = false, all_block = true;
    for (int w = 0; w < nb; w += 32) {
      bool any = false, all_warp = true;
      for (int i = w; i < nb && i < w + 32; ++i)
        if (th[i].st != kDone) { any = true; all_warp = all_warp && th[i].st == kWarp; }
      if (any && all_warp) {
        for (int i = w; i < nb && i < w + 32; ++i) if (th[i].st == kWarp) th[i].st = kRun;
        released = true;
      }
    }
    for (int i = 0; i < nb; ++i)
      if (th[i].st != kDone) { live = true; all_block = all_block && th[i].st == kBlock; }
    if (!live) return 0;
    if (released) continue;
    if (!all_block) return 1;
    for (int i = 0; i < nb; ++i) if (th[i].st == kBlock) th[i].st = kRun;
  }
}
}  // namespace kc_emu
static inline void __syncthreads() { kc_emu::wait(kc_emu::kBlock); }
static inline void __syncwarp(unsigned = 0xffffffffu) { kc_emu::vote(0, [](int) { return true; }); }
template <class T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  return kc_emu::exchange(v, (kc_emu::lane() & ~(width - 1)) + (src & (width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
  return kc_emu::exchange(v, kc_emu::lane() ^ m);
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
  const int l = kc_emu::lane(), s = l + (int)d;
  return kc_emu::exchange(v, (s & ~(width - 1)) == (l & ~(width - 1)) ? s : l);
}
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
  const int l = kc_emu::lane(), s = l - (int)d;
  return kc_emu::exchange(v, s >= (l & ~(width - 1)) ? s : l);
}
template <class T> static inline unsigned __match_any_sync(unsigned, T v) {
  return kc_emu::vote(v, [v](T o) { return o == v; });
}
static inline unsigned __ballot_sync(unsigned, int p) { return kc_emu::vote(p, [](int o) { return o != 0; }); }
static inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
static inline int __all_sync(unsigned, int p) { return kc_emu::vote(p, [](int o) { return o == 0; }) == 0; }
// cuLaunchKernel's kernelParams: args[i] points at the i-th parameter's value.
template <class... P, std::size_t... I>
static void kc_emu_apply(void (*f)(P...), void* const* a, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<P>*>(a[I])...);
}
template <class... P> static void kc_emu_call(void (*f)(P...), void* const* a) {
  kc_emu_apply(f, a, std::index_sequence_for<P...>{});
}
)CC";

// Constructs the emulation cannot give their meaning: thread block clusters, inline PTX (but for
// the 16-bit conversions of the dtype prelude, replaced below), dynamic shared memory.
const char* const kRefused[] = {"asm(", "asm volatile", "cooperative_groups", "extern __shared__"};
// The fp16 prelude's PTX conversions and their host forms.
const std::pair<const char*, const char*> kPtx[] = {
    {R"(asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));)", "f = kc_emu_h2f(v);"},
    {R"(asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));)", "h = kc_emu_f2h(f);"}};
// Sources whose threads never wait on each other run each thread straight through.
const char* const kCooperative[] = {"__syncthreads", "__syncwarp", "__shfl", "__match", "__ballot", "__any_sync", "__all_sync"};

std::string without_ptx(std::string src) {
  for (const auto& [ptx, host] : kPtx)
    for (size_t at; (at = src.find(ptx)) != std::string::npos;) src.replace(at, std::strlen(ptx), host);
  return src;
}

// The entries of a source after preprocessing (some sit in #if branches of a knob), where
// __global__ was defined as KC_EMU_GLOBAL.
std::vector<std::string> entries_of(const std::string& preprocessed) {
  static const std::regex re(R"(extern "C" KC_EMU_GLOBAL void ((?:__launch_bounds__|__cluster_dims__)\([^)]*\)\s*)*(\w+)\s*\()");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(preprocessed.begin(), preprocessed.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[2]);
  return out;
}

// The source the host compiles: the shim, each entry renamed so a wrapper can take its name, the
// kernel, then per entry a wrapper over every block: its threads straight through one after the
// other, or as coroutines where they wait on each other. A wrapper returns 1 on a deadlock.
std::string emulated_source(const std::string& src, const std::vector<std::string>& entries) {
  bool coop = false;
  for (const char* c : kCooperative) coop = coop || src.find(c) != std::string::npos;
  std::string pre = kShim, post;
  for (const std::string& e : entries) {
    pre += "#define " + e + " kc_cu_" + e + "\n";
    post += "#undef " + e + "\nstatic void kc_emu_body_" + e + "(void* const* a) { kc_emu_call(&kc_cu_" + e + ", a); }\n";
    post += "extern \"C\" int kc_emu_" + e + R"CC((const long long* d, void* const* a) {
  gridDim = {(unsigned)d[0], (unsigned)d[1], (unsigned)d[2]};
  blockDim = {(unsigned)d[3], (unsigned)d[4], (unsigned)d[5]};
  const int nb = (int)(blockDim.x * blockDim.y * blockDim.z);
  kc_emu::body = &kc_emu_body_)CC" + e + R"CC(;
  kc_emu::body_args = a;
  for (unsigned bz = 0; bz < gridDim.z; ++bz) for (unsigned by = 0; by < gridDim.y; ++by) for (unsigned bx = 0; bx < gridDim.x; ++bx) {
    blockIdx = {bx, by, bz};
)CC" + (coop ? "    if (kc_emu::run_block(nb)) return 1;\n"
             : "    for (int i = 0; i < nb; ++i) {\n"
               "      threadIdx = {(unsigned)(i % blockDim.x), (unsigned)(i / blockDim.x % blockDim.y), (unsigned)(i / (blockDim.x * blockDim.y))};\n"
               "      kc_emu::body(a);\n    }\n") +
            "  }\n  return 0;\n}\n";
  }
  post += "extern \"C\" void kc_emu_release() { std::free(kc_emu::stacks); kc_emu::stacks = nullptr; }\n";
  return pre + "#line 1 \"kernel.cu\"\n" + without_ptx(src) + "\n" + post;
}

using EmuEntry = int (*)(const long long*, void* const*);

class EmuLauncher : public Launcher {
 public:
  EmuLauncher(void* handle, std::vector<EmuEntry> fns, ResolvedSpec spec)
      : handle_(handle), fns_(std::move(fns)), spec_(std::move(spec)) {}
  ~EmuLauncher() override {
    if (auto release = reinterpret_cast<void (*)()>(dlsym(handle_, "kc_emu_release"))) release();   // parked coroutines' stacks
    dlclose(handle_);
  }

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
      if (fns_[i](dims, args.data()) != 0)
        return Status::error(Code::kLaunchError, l.entry + ": the threads of a block wait on each other forever");
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
    const std::string raw = dir.file("kernel.cu"), pre = dir.file("kernel.i"), src = dir.file("kernel.cpp"),
                      so = dir.file("kernel.so"), log = dir.file("compile.log");
    std::vector<std::string> cxx = split_command(load_config().cxx);   // the CPU backend's compiler
    if (cxx.empty()) cxx = {"c++"};
    ProcessOptions po;
    po.timeout_s = 120;
    po.output_path = log;
    if (!write_file(raw, source)) return Status::error(Code::kIOError, "cannot write " + raw);
    auto with = [&](std::vector<std::string> args) {
      args.insert(args.begin(), cxx.begin(), cxx.end());
      return args;
    };
    auto p = run_process(with({"-E", "-P", "-x", "c++", "-D__global__=KC_EMU_GLOBAL", "-o", pre, raw}), po);
    if (!p.is_ok()) return p.status();
    if (!p->ok()) return Status::error(Code::kCompileError, "preprocessing for the emulation failed:\n" + read_file(log));
    if (!write_file(src, emulated_source(source, entries_of(read_file(pre))))) return Status::error(Code::kIOError, "cannot write " + src);
    // -fno-gnu-unique: a static in an inline function (`__shared__` in a __forceinline__ helper)
    // would otherwise be one STB_GNU_UNIQUE object for the whole process, so a candidate loaded
    // later would use an earlier candidate's array, of its sizes; each emulation is its own.
    auto r = run_process(with({"-std=c++17", "-O1", "-shared", "-fPIC", "-fno-gnu-unique", "-w", "-o", so, src}), po);
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
  const std::string host = without_ptx(source);
  for (const char* r : kRefused)
    if (host.find(r) != std::string::npos) return std::string("uses ") + r;
  // A cluster of blocks that wait for each other (cuda.batch_norm's CL): blocks run one by one here.
  static const std::regex cluster(R"(#define CL (\d+))");
  std::smatch m;
  if (std::regex_search(host, m, cluster) && std::stoi(m[1]) > 1) return "clusters of " + m[1].str() + " blocks";
  return "";
}

Backend& emu_backend() {
  static EmuBackend b;
  return b;
}

}  // namespace kc::evolve::gpu_run
