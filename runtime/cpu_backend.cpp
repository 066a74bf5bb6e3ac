// CPU backend: host compiler in a private temp dir -> .so bytes -> memfd + dlopen -> parallel_for.
#include "runtime/cpu_backend.h"
#include "runtime/fork.h"
#include "runtime/fsutil.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "runtime/binary_check.h"
#include "runtime/config.h"
#include "runtime/kc_cpu.h"
#include "runtime/log.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"

namespace kc {
namespace {


constexpr double kCompileTimeoutS = 120;

const char kPrelude[] =
#include "kc_cpu_prelude.inc"  // generated from runtime/kc_cpu.h by runtime/CMakeLists.txt
    ;

// What the host toolchain is and the flags every kernel gets; probed once per process.
struct Toolchain {
  std::vector<std::string> cxx;        // the compiler command, split on whitespace
  std::vector<std::string> flags;
  std::string target_id;
  Status status;                       // kUnavailable when no usable compiler was found
};

// The x86-64 micro-architecture level this CPU runs, so kernels may use it and the key says so.
int x86_level() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("ssse3")))
    return 1;
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
        __builtin_cpu_supports("bmi2")))
    return 2;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")))
    return 3;
  return 4;
#else
  return 0;
#endif
}

// Runs the preprocessor on a probe so the id names the compiler that will build kernels (which
// need not be the one that built this library).
Result<std::string> compiler_id(const std::vector<std::string>& cxx, const std::vector<std::string>& march) {
  ScopedTempDir dir("probe");
  if (!dir.ok()) return Status::error(Code::kIOError, "cannot create a temp dir for the compiler probe");
  const std::string src = dir.file("probe.cpp"), out = dir.file("probe.out");
  if (!write_file(src,
                  "#if defined(__clang__)\nkc_id clang __clang_major__ . __clang_minor__ . __clang_patchlevel__\n"
                  "#elif defined(__GNUC__)\nkc_id gcc __GNUC__ . __GNUC_MINOR__ . __GNUC_PATCHLEVEL__\n"
                  "#else\nkc_id other 0 . 0 . 0\n#endif\n"))
    return Status::error(Code::kIOError, "cannot write the compiler probe");
  std::vector<std::string> argv = cxx;
  argv.insert(argv.end(), march.begin(), march.end());
  argv.insert(argv.end(), {"-E", "-P", "-x", "c++", src});
  ProcessOptions po;
  po.timeout_s = 30;
  po.output_path = out;
  po.env = {"LC_ALL=C"};
  Result<ProcessResult> r = run_process(argv, po);
  if (!r.is_ok()) return r.status();
  std::string text = read_file(out);
  if (!r->ok() && r->status_known) return Status::error(Code::kUnavailable, "compiler probe failed: " + text);
  std::istringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    char name[32];
    int a, b, c;
    if (std::sscanf(line.c_str(), "kc_id %31s %d . %d . %d", name, &a, &b, &c) == 4)
      return std::string(name) + "-" + std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
  }
  return Status::error(Code::kUnavailable, "compiler probe printed no id: " + text);
}

const Toolchain& toolchain() {
  static Toolchain tc;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string cxx = load_config().cxx;
    tc.cxx = split_command(cxx);
    if (tc.cxx.empty()) tc.cxx = {"c++"};
    std::string arch = "unknown";
    std::vector<std::string> march;
#if defined(__x86_64__)
    // At most x86-64-v3: the binary check's disassembler (capstone 4, Debian 12's) cannot decode
    // every AVX-512 instruction (EVEX compares into mask registers), and a kernel it cannot read
    // completely is one it cannot clear of system calls (honest v4 kernels were refused on the
    // H200 host, whose CPU has AVX-512).
    int level = std::min(x86_level(), 3);
    arch = level > 1 ? "x86_64-v" + std::to_string(level) : "x86_64";
    march = {level > 1 ? "-march=x86-64-v" + std::to_string(level) : "-march=x86-64"};
#elif defined(__aarch64__)
    arch = "aarch64";
#endif
    Result<std::string> id = compiler_id(tc.cxx, march);
#if defined(__x86_64__)
    if (!id.is_ok() && level > 1) {  // compilers older than gcc 11 / clang 12 lack -march=x86-64-vN
      arch = "x86_64";
      march = {"-march=x86-64"};
      id = compiler_id(tc.cxx, march);
    }
#endif
    // -nostartfiles: no crtbeginS/crtendS, whose frame_dummy and __do_global_dtors_aux would sit
    // in .init_array/.fini_array of every kernel; without them a kernel has no load-time code at
    // all, and the binary check (binary_check.h) can demand exactly that.
    tc.flags = {"-O3", "-std=c++17", "-shared", "-fPIC", "-fno-exceptions", "-Wall", "-Wl,-z,defs", "-nostartfiles"};
    tc.flags.insert(tc.flags.end(), march.begin(), march.end());
    if (!id.is_ok()) {
      tc.status = Status::error(Code::kUnavailable, "host compiler '" + cxx + "': " + id.status().message());
      tc.target_id = "cpu-" + arch + "+nocompiler";
      log_once(LogLevel::kWarn, "cpu-compiler", "CPU kernels disabled: " + tc.status.message());
      return;
    }
    // gcc marks some inline statics STB_GNU_UNIQUE, which makes dlclose keep the object loaded.
    if (id.value().rfind("gcc-", 0) == 0) tc.flags.push_back("-fno-gnu-unique");
    // "+abi2": kernels built as above (no start files), which the binary check accepts. Records
    // built before it carry crt code the check refuses; under their old key they are never looked
    // up again, so those keys miss and are searched anew instead of being refused at every load.
    tc.target_id = "cpu-" + arch + "+" + id.value() + "+abi2";
  });
  return tc;
}

using EntryFn = void (*)(const kc_cpu_ctx*, void* const*);

// Owns a dlopen handle and the memfd that names it; see open_shared_object for why both.
struct SharedObject {
  void* handle = nullptr;
  int fd = -1;
  SharedObject() = default;
  SharedObject(const SharedObject&) = delete;
  SharedObject& operator=(const SharedObject&) = delete;
  ~SharedObject() {
    if (handle) dlclose(handle);
    if (fd >= 0) close(fd);
  }
};

// One per process (runtime/fork.h): a fork()ed child never waits on a lock a parent's thread held.
std::mutex& dlopen_mu() {
  static constinit PerFork<std::mutex> m;
  return m.get();
}

// glibc identifies loaded objects by path: a "/proc/self/fd/N" still loaded (or stuck loaded)
// from an earlier kernel would be returned instead of the new one. Keeping the memfd open while
// the object is loaded reserves N; RTLD_NOLOAD catches anything else holding the name.
bool name_in_use(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) return false;
  dlclose(h);
  return true;
}

Status open_shared_object(const std::string& binary, SharedObject& so) {
  std::lock_guard<std::mutex> g(dlopen_mu());
  std::string memfd_err;
  int fd = memfd_create("kc-cpu-kernel", MFD_CLOEXEC);
  if (fd >= 0) {
    so.fd = fd;
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    if (static_cast<size_t>(write(fd, binary.data(), binary.size())) != binary.size()) {
      memfd_err = "short write to memfd";
    } else if (name_in_use(path)) {
      memfd_err = path + " is already a loaded object";
    } else if ((so.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      return Status::ok();
    } else {
      const char* e = dlerror();
      memfd_err = e ? e : "dlopen failed";
    }
    close(so.fd);
    so.fd = -1;
  } else {
    memfd_err = "memfd_create failed";
  }
  // Fallback (memfd exec forbidden by policy, old kernels): a private file, unlinked once mapped.
  ScopedTempDir dir("so");
  if (!dir.ok()) return Status::error(Code::kLaunchError, "dlopen: " + memfd_err + "; no temp dir for the fallback");
  std::string path = dir.file("kernel.so");
  if (!write_file(path, binary))
    return Status::error(Code::kLaunchError, "dlopen: " + memfd_err + "; cannot write " + path);
  so.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!so.handle) {
    const char* e = dlerror();
    return Status::error(Code::kLaunchError, std::string("cannot load the CPU kernel: ") + (e ? e : "dlopen failed") +
                                                 " (memfd path: " + memfd_err + ")");
  }
  return Status::ok();
}

class CpuLauncher : public Launcher {
 public:
  CpuLauncher(std::unique_ptr<SharedObject> so, ResolvedSpec spec, std::vector<EntryFn> entries)
      : so_(std::move(so)), spec_(std::move(spec)), entries_(std::move(entries)) {}

  Status run(void* const* ptrs, const ExecContext& ctx) override {
    if (!ptrs && spec_.num_slots() > 0) return Status::error(Code::kInvalid, "CPU launch without its pointer table");
    for (size_t li = 0; li < spec_.launches.size(); ++li) {
      const ResolvedLaunch& l = spec_.launches[li];
      const size_t n = l.params.size();
      // Pointer values live in `vals`; args[i] points at the value, as kernelParams does on CUDA.
      constexpr size_t kInline = 32;
      void* vals_inline[kInline];
      void* args_inline[kInline];
      std::vector<void*> vals_heap, args_heap;
      void** vals = vals_inline;
      void** args = args_inline;
      if (n > kInline) {
        vals_heap.resize(n);
        args_heap.resize(n);
        vals = vals_heap.data();
        args = args_heap.data();
      }
      for (size_t i = 0; i < n; ++i) {
        const Param& p = l.params[i];
        if (p.kind == Param::Kind::kPtr) {
          vals[i] = ptrs[p.slot];
          args[i] = &vals[i];
        } else {
          args[i] = const_cast<void*>(static_cast<const void*>(&p.imm));
        }
      }
      kc_cpu_ctx base{};
      for (int d = 0; d < 3; ++d) {
        base.grid[d] = l.grid[d];
        base.block[d] = l.block[d];
      }
      const int64_t total = l.grid[0] * l.grid[1] * l.grid[2];  // overflow checked in load()
      EntryFn fn = entries_[li];
      auto range = [&](int64_t b, int64_t e) {
        if (b >= e) return;
        kc_cpu_ctx c = base;
        c.begin = b;
        c.end = e;
        fn(&c, args);
      };
      if (ctx.parallel_for) ctx.parallel_for(total, range);
      else range(0, total);
    }
    return Status::ok();
  }

 private:
  std::unique_ptr<SharedObject> so_;
  ResolvedSpec spec_;
  std::vector<EntryFn> entries_;   // one per launch
};

class CpuBackend : public Backend {
 public:
  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string target_id() const override { return toolchain().target_id; }

  Result<CompileOutput> compile(const std::string& source) override { return cpu_compile(source, {}); }

  Result<std::unique_ptr<Launcher>> load(const std::string& binary, const ResolvedSpec& spec) override {
    return cpu_load(binary, spec, BinaryPolicy::kKernel);
  }
};

}  // namespace

Result<CompileOutput> cpu_compile(const std::string& source, const std::vector<std::string>& extra_flags) {
    const Toolchain& tc = toolchain();
    if (!tc.status.is_ok()) return tc.status;
    auto t0 = std::chrono::steady_clock::now();
    ScopedTempDir dir("cc");
    if (!dir.ok()) return Status::error(Code::kIOError, "cannot create a temp dir for the CPU compiler");
    const std::string hdr = dir.file("kc_cpu.h"), src = dir.file("kernel.cpp"), so = dir.file("kernel.so"),
                      logf = dir.file("compile.log");
    // Included rather than pasted so "#pragma once" is not in the main file, and #line keeps the
    // compiler's line numbers those of the proposer's source.
    if (!write_file(hdr, kPrelude) ||
        !write_file(src, "#include \"kc_cpu.h\"\n#line 1 \"kernel.cpp\"\n" + source))
      return Status::error(Code::kIOError, "cannot write the CPU kernel source");
    std::vector<std::string> argv = tc.cxx;
    argv.insert(argv.end(), tc.flags.begin(), tc.flags.end());
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    // The temp dir's name must not reach the binary (debug info of sanitizer builds, __FILE__):
    // the same source and flags give the same bytes anywhere, which bundle import relies on.
    argv.push_back("-ffile-prefix-map=" + dir.path() + "/=");
    argv.insert(argv.end(), {"-o", so, "-x", "c++", src});
    ProcessOptions po;
    po.timeout_s = kCompileTimeoutS;
    po.output_path = logf;
    po.env = {"LC_ALL=C"};
    Result<ProcessResult> r = run_process(argv, po);
    if (!r.is_ok()) {
      if (r.status().code() == Code::kTimeout) return Status::error(Code::kCompileError, r.status().message());
      return r.status();
    }
    CompileOutput out;
    out.log = read_file(logf);
    out.binary = read_file(so);
    bool ok = r->status_known ? r->ok() : !out.binary.empty();
    if (!ok || out.binary.empty()) {
      std::string why = r->exited ? "exit code " + std::to_string(r->exit_code) : "signal " + std::to_string(r->signal);
      return Status::error(Code::kCompileError, "host compiler failed (" + why + "):\n" + out.log);
    }
    out.millis = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

Result<std::unique_ptr<Launcher>> cpu_load(const std::string& binary, const ResolvedSpec& spec, BinaryPolicy policy) {
    if (binary.size() < 4 || binary.compare(0, 4, "\x7f" "ELF") != 0)
      return Status::error(Code::kLaunchError, "CPU kernel binary is not an ELF shared object");
    // Judged before dlopen: a constructor or IFUNC resolver would run inside dlopen itself.
    if (BinaryCheck bc = check_cpu_binary(binary, policy); !bc.ok())
      return Status::error(Code::kLaunchError, "CPU kernel binary refused: " + bc.message());
    for (const auto& l : spec.launches) {
      int64_t t;
      if (__builtin_mul_overflow(l.grid[0], l.grid[1], &t) || __builtin_mul_overflow(t, l.grid[2], &t))
        return Status::error(Code::kLaunchError, "grid of '" + l.entry + "' overflows int64");
    }
    auto so = std::make_unique<SharedObject>();
    KC_RETURN_IF_ERROR(open_shared_object(binary, *so));
    std::vector<EntryFn> entries;
    std::unordered_map<std::string, EntryFn> seen;
    for (const auto& l : spec.launches) {
      auto it = seen.find(l.entry);
      if (it == seen.end()) {
        dlerror();
        void* sym = dlsym(so->handle, l.entry.c_str());
        if (!sym)
          return Status::error(Code::kLaunchError, "entry '" + l.entry + "' not found in the CPU kernel (is it extern \"C\"?)");
        it = seen.emplace(l.entry, reinterpret_cast<EntryFn>(sym)).first;
      }
      entries.push_back(it->second);
    }
    return std::unique_ptr<Launcher>(new CpuLauncher(std::move(so), spec, std::move(entries)));
}

const char* cpu_kernel_prelude() { return kPrelude; }

Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace kc
