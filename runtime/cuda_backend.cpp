// CUDA backend: NVRTC -> CUBIN; modules in the device's primary context; checked cuLaunchKernel.
#include "runtime/cuda_backend.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/cuda_api.h"
#include "runtime/fork.h"
#include "runtime/log.h"

namespace kc {
namespace {

// Destroys the program on every path (jiterator's leak was a program kept on failure).
struct ProgramGuard {
  const NvrtcApi& a;
  NvrtcProgram p = nullptr;
  explicit ProgramGuard(const NvrtcApi& api) : a(api) {}
  ~ProgramGuard() {
    if (p) a.nvrtcDestroyProgram(&p);
  }
};

std::string program_log(const NvrtcApi& a, NvrtcProgram p) {
  size_t n = 0;
  if (a.nvrtcGetProgramLogSize(p, &n) != 0 || n <= 1) return "";
  std::string log(n, '\0');
  if (a.nvrtcGetProgramLog(p, &log[0]) != 0) return "";
  log.resize(std::strlen(log.c_str()));
  return log;
}

std::string dims(const int64_t d[3]) {
  return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) + ")";
}

uint64_t read_le(const std::string& b, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[off + i]);
  return v;
}

// cuModuleLoadData takes no size and trusts the ELF headers: reject blobs whose header tables
// point past their end (a truncated cache record must fail here, not read out of bounds).
Status check_cubin(const std::string& b) {
  if (b.size() < 64 || b.compare(0, 4, "\x7f" "ELF") != 0 || b[4] != 2)
    return Status::error(Code::kLaunchError, "not a 64-bit ELF CUBIN");
  uint64_t phoff = read_le(b, 0x20, 8), shoff = read_le(b, 0x28, 8);
  uint64_t phent = read_le(b, 0x36, 2), phnum = read_le(b, 0x38, 2);
  uint64_t shent = read_le(b, 0x3A, 2), shnum = read_le(b, 0x3C, 2);
  if (phoff > b.size() || phent * phnum > b.size() - phoff || shoff > b.size() || shent * shnum > b.size() - shoff)
    return Status::error(Code::kLaunchError, "truncated CUBIN (" + std::to_string(b.size()) + " bytes)");
  return Status::ok();
}

// Keeps a module loaded for as long as launchers use it; unloads in its own context.
struct Module {
  const DriverApi& d;
  CUcontext ctx;
  CUmodule m = nullptr;
  Module(const DriverApi& api, CUcontext c) : d(api), ctx(c) {}
  ~Module() {
    if (!m) return;
    ScopedContext sc(d, ctx);
    if (sc.status().is_ok()) d.cuModuleUnload(m);
  }
};

class CudaLauncher : public Launcher {
 public:
  CudaLauncher(const DriverApi& d, CUcontext ctx, std::unique_ptr<Module> mod, ResolvedSpec spec,
               std::vector<CUfunction> funcs)
      : d_(d), ctx_(ctx), mod_(std::move(mod)), spec_(std::move(spec)), funcs_(std::move(funcs)) {}

  Status run(void* const* ptrs, const ExecContext& ctx) override {
    if (!ptrs && spec_.num_slots() > 0) return Status::error(Code::kInvalid, "CUDA launch without its pointer table");
    ScopedContext sc(d_, ctx_);
    KC_RETURN_IF_ERROR(sc.status());
    for (size_t li = 0; li < spec_.launches.size(); ++li) {
      const ResolvedLaunch& l = spec_.launches[li];
      const size_t n = l.params.size();
      constexpr size_t kInline = 32;
      CUdeviceptr vals_inline[kInline];
      void* args_inline[kInline];
      std::vector<CUdeviceptr> vals_heap;
      std::vector<void*> args_heap;
      CUdeviceptr* vals = vals_inline;
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
          vals[i] = reinterpret_cast<CUdeviceptr>(ptrs[p.slot]);
          args[i] = &vals[i];
        } else {
          args[i] = const_cast<void*>(static_cast<const void*>(&p.imm));
        }
      }
      CUresult r = d_.cuLaunchKernel(funcs_[li], static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]),
                                     static_cast<unsigned>(l.grid[2]), static_cast<unsigned>(l.block[0]),
                                     static_cast<unsigned>(l.block[1]), static_cast<unsigned>(l.block[2]),
                                     static_cast<unsigned>(l.smem), static_cast<CUstream>(ctx.stream), args, nullptr);
      if (r != CUDA_SUCCESS)
        return Status::error(Code::kLaunchError,
                             "launch " + std::to_string(li + 1) + "/" + std::to_string(spec_.launches.size()) + " of '" +
                                 l.entry + "' grid " + dims(l.grid) + " block " + dims(l.block) + " smem " +
                                 std::to_string(l.smem) + ": " + cu_error(d_, r));
    }
    return Status::ok();
  }

 private:
  const DriverApi& d_;
  CUcontext ctx_;
  std::unique_ptr<Module> mod_;
  ResolvedSpec spec_;
  std::vector<CUfunction> funcs_;  // one per launch
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const DriverApi& d, CUcontext primary, int sm, std::string target)
      : d_(d), ctx_(primary), sm_(sm), target_(std::move(target)) {}

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string target_id() const override { return target_; }
  Result<CompileOutput> compile(const std::string& source) override { return nvrtc_compile(source, sm_); }

  Status query_limits(CUdevice dev) {
    struct { CUdevice_attribute a; int* out; } q[] = {
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &max_threads_},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &max_block_[0]},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, &max_block_[1]},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, &max_block_[2]},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &max_smem_optin_},
    };
    for (auto& e : q) {
      CUresult r = d_.cuDeviceGetAttribute(e.out, e.a, dev);
      if (r != CUDA_SUCCESS) return Status::error(Code::kUnavailable, "cuDeviceGetAttribute: " + cu_error(d_, r));
    }
    return Status::ok();
  }

  Result<std::unique_ptr<Launcher>> load(const std::string& binary, const ResolvedSpec& spec) override {
    KC_RETURN_IF_ERROR(check_cubin(binary));
    ScopedContext sc(d_, ctx_);
    KC_RETURN_IF_ERROR(sc.status());
    auto mod = std::make_unique<Module>(d_, ctx_);
    CUresult r = d_.cuModuleLoadData(&mod->m, binary.data());
    if (r != CUDA_SUCCESS) {
      mod->m = nullptr;
      return Status::error(Code::kLaunchError, "cuModuleLoadData: " + cu_error(d_, r));
    }
    struct Entry { CUfunction f; int max_threads; int static_smem; int64_t dyn_smem; };
    std::unordered_map<std::string, Entry> entries;
    std::vector<CUfunction> funcs;
    for (const auto& l : spec.launches) {
      auto it = entries.find(l.entry);
      if (it == entries.end()) {
        Entry e{};
        r = d_.cuModuleGetFunction(&e.f, mod->m, l.entry.c_str());
        if (r != CUDA_SUCCESS)
          return Status::error(Code::kLaunchError, "entry '" + l.entry + "' not in the module (extern \"C\" __global__?): " +
                                                       cu_error(d_, r));
        d_.cuFuncGetAttribute(&e.max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, e.f);
        d_.cuFuncGetAttribute(&e.static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, e.f);
        it = entries.emplace(l.entry, e).first;
      }
      Entry& e = it->second;
      std::string where = "'" + l.entry + "' grid " + dims(l.grid) + " block " + dims(l.block);
      int64_t threads = l.block[0] * l.block[1] * l.block[2];
      int64_t limit = max_threads_;
      if (e.max_threads > 0 && e.max_threads < limit) limit = e.max_threads;
      if (threads > limit)
        return Status::error(Code::kLaunchError, where + ": " + std::to_string(threads) + " threads per block, limit " +
                                                     std::to_string(limit) + " (device " + std::to_string(max_threads_) +
                                                     ", kernel registers / __launch_bounds__ " +
                                                     std::to_string(e.max_threads) + ")");
      for (int dd = 0; dd < 3; ++dd) {
        if (l.block[dd] > max_block_[dd])
          return Status::error(Code::kLaunchError, where + ": block dimension " + std::to_string(dd) + " exceeds " +
                                                       std::to_string(max_block_[dd]));
        if (l.grid[dd] > UINT_MAX)
          return Status::error(Code::kLaunchError, where + ": grid dimension " + std::to_string(dd) + " exceeds 2^32-1");
      }
      if (l.smem + e.static_smem > max_smem_optin_)
        return Status::error(Code::kLaunchError, where + ": " + std::to_string(l.smem) + " B dynamic + " +
                                                     std::to_string(e.static_smem) + " B static shared memory exceeds " +
                                                     std::to_string(max_smem_optin_) + " B");
      if (l.smem > e.dyn_smem) e.dyn_smem = l.smem;
      funcs.push_back(e.f);
    }
    // Above 48 KiB the kernel must opt in to the larger dynamic shared memory carve-out.
    for (auto& [name, e] : entries) {
      if (e.dyn_smem <= 48 * 1024) continue;
      r = d_.cuFuncSetAttribute(e.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(e.dyn_smem));
      if (r != CUDA_SUCCESS)
        return Status::error(Code::kLaunchError, "'" + name + "': cannot allow " + std::to_string(e.dyn_smem) +
                                                     " B dynamic shared memory: " + cu_error(d_, r));
    }
    return std::unique_ptr<Launcher>(new CudaLauncher(d_, ctx_, std::move(mod), spec, std::move(funcs)));
  }

 private:
  const DriverApi& d_;
  CUcontext ctx_;
  int sm_;
  std::string target_;
  int max_threads_ = 1024, max_block_[3] = {1024, 1024, 64}, max_smem_optin_ = 48 * 1024;
};

Result<Backend*> make_backend(int device) {
  Result<const DriverApi*> dr = cuda_driver();
  if (!dr.is_ok()) return dr.status();
  const DriverApi& d = *dr.value();
  CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) return Status::error(Code::kUnavailable, "cuInit: " + cu_error(d, r));
  int count = 0;
  r = d.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return Status::error(Code::kUnavailable, "cuDeviceGetCount: " + cu_error(d, r));
  if (device < 0 || device >= count)
    return Status::error(Code::kUnavailable, "no CUDA device " + std::to_string(device) + " (" + std::to_string(count) +
                                                 " present)");
  CUdevice dev;
  r = d.cuDeviceGet(&dev, device);
  if (r != CUDA_SUCCESS) return Status::error(Code::kUnavailable, "cuDeviceGet: " + cu_error(d, r));
  int major = 0, minor = 0, drv = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  d.cuDriverGetVersion(&drv);
  Result<const NvrtcApi*> nv = nvrtc_api();
  if (!nv.is_ok()) return nv.status();
  // PyTorch allocates and launches in the primary context; modules must live there too.
  CUcontext primary = nullptr;
  r = d.cuDevicePrimaryCtxRetain(&primary, dev);
  if (r != CUDA_SUCCESS) return Status::error(Code::kUnavailable, "cuDevicePrimaryCtxRetain: " + cu_error(d, r));
  int sm = major * 10 + minor;
  std::string target = "cuda-sm_" + std::to_string(sm) + "+drv-" + std::to_string(drv / 1000) + "." +
                       std::to_string((drv % 1000) / 10) + "+nvrtc-" + std::to_string(nv.value()->major) + "." +
                       std::to_string(nv.value()->minor);
  // Never deleted: the primary context stays retained for the process, and releasing it from a
  // static destructor would race the driver's own teardown.
  auto* b = new CudaBackend(d, primary, sm, target);
  Status s = b->query_limits(dev);
  if (!s.is_ok()) {
    d.cuDevicePrimaryCtxRelease(dev);
    delete b;
    return s;
  }
  log(LogLevel::kInfo, "CUDA device " + std::to_string(device) + ": " + target);
  return static_cast<Backend*>(b);
}

}  // namespace

Result<CompileOutput> nvrtc_compile(const std::string& source, int sm_arch) {
  Result<const NvrtcApi*> nv = nvrtc_api();
  if (!nv.is_ok()) return nv.status();
  const NvrtcApi& a = *nv.value();
  int n = 0;
  std::vector<int> archs;
  if (a.nvrtcGetNumSupportedArchs(&n) == 0 && n > 0) {
    archs.resize(static_cast<size_t>(n));
    if (a.nvrtcGetSupportedArchs(archs.data()) != 0) archs.clear();
  }
  if (!archs.empty() && std::find(archs.begin(), archs.end(), sm_arch) == archs.end())
    return Status::error(Code::kUnsupported, "NVRTC " + std::to_string(a.major) + "." + std::to_string(a.minor) +
                                                 " cannot target sm_" + std::to_string(sm_arch) + " (supports sm_" +
                                                 std::to_string(archs.front()) + " to sm_" + std::to_string(archs.back()) + ")");
  auto t0 = std::chrono::steady_clock::now();
  ProgramGuard prog(a);
  int rc = a.nvrtcCreateProgram(&prog.p, source.c_str(), "kernel.cu", 0, nullptr, nullptr);
  if (rc != 0) {
    prog.p = nullptr;
    return Status::error(Code::kCompileError, std::string("nvrtcCreateProgram: ") + a.nvrtcGetErrorString(rc));
  }
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(sm_arch);
  // Line info costs nothing at run time and lets compute-sanitizer name source lines.
  const std::string inc = "--include-path=" + a.include_dir;
  std::vector<const char*> opts = {arch.c_str(), "-std=c++17", "--generate-line-info"};
  if (!a.include_dir.empty()) opts.push_back(inc.c_str());
  rc = a.nvrtcCompileProgram(prog.p, static_cast<int>(opts.size()), opts.data());
  CompileOutput out;
  out.log = program_log(a, prog.p);
  if (rc != 0)
    return Status::error(Code::kCompileError, std::string("NVRTC: ") + a.nvrtcGetErrorString(rc) + "\n" + out.log);
  size_t size = 0;
  if ((rc = a.nvrtcGetCUBINSize(prog.p, &size)) != 0 || size == 0)
    return Status::error(Code::kCompileError, std::string("nvrtcGetCUBINSize: ") + a.nvrtcGetErrorString(rc));
  out.binary.resize(size);
  if ((rc = a.nvrtcGetCUBIN(prog.p, &out.binary[0])) != 0)
    return Status::error(Code::kCompileError, std::string("nvrtcGetCUBIN: ") + a.nvrtcGetErrorString(rc));
  out.millis = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<std::string> nvrtc_version() {
  Result<const NvrtcApi*> nv = nvrtc_api();
  if (!nv.is_ok()) return nv.status();
  return std::to_string(nv.value()->major) + "." + std::to_string(nv.value()->minor);
}

Result<Backend*> cuda_backend(int device) {
  static constinit PerFork<std::mutex> mu_per_process;   // runtime/fork.h
  std::mutex& mu = mu_per_process.get();
  static auto* backends = new std::map<int, Result<Backend*>>();  // never destroyed, see make_backend
  std::lock_guard<std::mutex> g(mu);
  auto it = backends->find(device);
  if (it != backends->end()) return it->second;
  Result<Backend*> b = make_backend(device);
  // Absent drivers and devices do not appear mid-process: remember failures as well.
  backends->emplace(device, b);
  return b;
}

Status cuda_available(int device) {
  Result<Backend*> b = cuda_backend(device);
  return b.is_ok() ? Status::ok() : b.status();
}

Result<std::string> cuda_resources_json(int device, const std::string& cubin, const std::vector<std::string>& entries) {
  auto be = cuda_backend(device);
  if (!be) return be.status();
  const DriverApi& d = *cuda_driver().value();
  CUdevice dev;
  CUresult r = d.cuDeviceGet(&dev, device);
  CUcontext primary = nullptr;
  if (r == CUDA_SUCCESS) r = d.cuDevicePrimaryCtxRetain(&primary, dev);
  if (r != CUDA_SUCCESS) return Status::error(Code::kUnavailable, "primary context: " + cu_error(d, r));
  nlohmann::json out = nlohmann::json::object();
  Status st;
  {
    ScopedContext scope(d, primary);
    CUmodule mod = nullptr;
    r = d.cuModuleLoadData(&mod, cubin.data());
    if (r != CUDA_SUCCESS) {
      st = Status::error(Code::kLaunchError, "cuModuleLoadData: " + cu_error(d, r));
    } else {
      for (const auto& e : entries) {
        CUfunction f;
        if (d.cuModuleGetFunction(&f, mod, e.c_str()) != CUDA_SUCCESS) continue;
        auto attr = [&](CUfunction_attribute a) {
          int v = 0;
          d.cuFuncGetAttribute(&v, a, f);
          return v;
        };
        out[e] = {{"registers", attr(CU_FUNC_ATTRIBUTE_NUM_REGS)},
                  {"static_smem", attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)},
                  {"local_bytes", attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)},
                  {"const_bytes", attr(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)},
                  {"max_threads", attr(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)}};
      }
      d.cuModuleUnload(mod);
    }
  }
  d.cuDevicePrimaryCtxRelease(dev);
  if (!st) return st;
  return out.dump();
}

}  // namespace kc
