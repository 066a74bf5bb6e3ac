// Lazy loading of libcuda and libnvrtc into the tables of cuda_api.h (one call_once each).
#include "runtime/cuda_api.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "runtime/config.h"
#include "runtime/log.h"

#define KC_STR2(x) #x
#define KC_STR(x) KC_STR2(x)

namespace kc {
namespace {

// Versioned names newer than some drivers still in use, and the older symbol with the same
// signature to fall back to.
const char* fallback_symbol(const char* name) {
  static const char* const kPairs[][2] = {{"cuEventElapsedTime_v2", "cuEventElapsedTime"}};
  for (const auto& p : kPairs)
    if (std::strcmp(p[0], name) == 0) return p[1];
  return nullptr;
}

struct DriverState {
  DriverApi api;
  Status status;
};

DriverState& driver_state() {
  // Never destroyed: kernels may be unloaded from other static destructors at exit.
  static DriverState* s = new DriverState();
  return *s;
}

void load_driver(DriverState& s) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    s.status = Status::error(Code::kUnavailable, std::string("CUDA driver not found (libcuda.so.1): ") +
                                                     (e ? e : "dlopen failed"));
    return;
  }
  // The handle is kept for the life of the process: driver state cannot be torn down safely.
  std::string missing;
#define KC_CUDA_LOAD(fn)                                                          \
  {                                                                               \
    void* p = dlsym(h, KC_STR(fn));                                               \
    if (!p && fallback_symbol(KC_STR(fn))) p = dlsym(h, fallback_symbol(KC_STR(fn))); \
    if (p) s.api.fn = reinterpret_cast<decltype(s.api.fn)>(p);                    \
    else missing += std::string(missing.empty() ? "" : ", ") + KC_STR(fn);        \
  }
  KC_CUDA_DRIVER_FUNCS(KC_CUDA_LOAD)
#undef KC_CUDA_LOAD
  if (!missing.empty()) {
    s.api = DriverApi();
    s.status = Status::error(Code::kUnavailable, "CUDA driver too old, missing: " + missing);
  }
}

struct NvrtcState {
  NvrtcApi api;
  Status status;
};

NvrtcState& nvrtc_state() {
  static NvrtcState* s = new NvrtcState();
  return *s;
}

// Directories of loaded torch libraries: pip's nvidia wheels sit next to the torch package.
int collect_torch_dirs(struct dl_phdr_info* info, size_t, void* data) {
  auto* dirs = static_cast<std::vector<std::string>*>(data);
  if (!info->dlpi_name || !*info->dlpi_name) return 0;
  std::string path(info->dlpi_name);
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return 0;
  std::string base = path.substr(slash + 1);
  if (base.rfind("libc10.so", 0) == 0 || base.rfind("libtorch", 0) == 0) dirs->push_back(path.substr(0, slash));
  return 0;
}

std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> c;
  const Config cfg = load_config();
  if (!cfg.nvrtc_path.empty()) c.push_back(cfg.nvrtc_path);
  c.insert(c.end(), {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"});
  std::vector<std::string> dirs;
  dl_iterate_phdr(collect_torch_dirs, &dirs);
#ifdef KC_BUILD_TORCH_LIBDIR
  dirs.push_back(KC_BUILD_TORCH_LIBDIR);
#endif
  std::set<std::string> seen;
  for (const auto& d : dirs) {
    if (!seen.insert(d).second) continue;
    c.push_back(d + "/../../nvidia/cu13/lib/libnvrtc.so.13");
    c.push_back(d + "/../../nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
  }
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) c.push_back(std::string(home) + "/lib64/libnvrtc.so");
  c.push_back("/usr/local/cuda/lib64/libnvrtc.so");
  return c;
}

// The directory the loader took an opened library from ("" if unknown): a bare soname has no
// directory of its own, so ask the loader where it found it.
std::string loaded_dir(void* h) {
  struct link_map* lm = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name) return "";
  std::string real = lm->l_name;
  size_t slash = real.rfind('/');
  return slash == std::string::npos ? "" : real.substr(0, slash);
}

// libnvrtc dlopens its builtins by bare name at the first compile. From a pip wheel
// (nvidia/cu13/lib) or a toolkit directory that is not on the loader's search path that fails
// ("failed to open libnvrtc-builtins.so.13.0"). Loading the builtins from libnvrtc's own directory
// first, by full path, makes that later lookup find the loaded copy by its soname. Never closed,
// like libnvrtc itself.
void preload_nvrtc_builtins(const std::string& dir, int major, int minor) {
  if (dir.empty()) return;
  std::vector<std::string> names = {"libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor)};
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::string n = e->d_name; n.rfind("libnvrtc-builtins.so", 0) == 0 && n != names[0]) names.push_back(n);
    closedir(d);
  }
  for (const auto& n : names) {
    const std::string full = dir + "/" + n;
    if (access(full.c_str(), R_OK) != 0) continue;
    if (dlopen(full.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      log(LogLevel::kDebug, "NVRTC builtins from " + full);
      return;
    }
    const char* e = dlerror();
    log(LogLevel::kDebug, "cannot preload " + full + ": " + (e ? e : "dlopen failed"));
  }
}

// Where the toolkit's device headers are, for kernels that include cuda_fp16.h or cuda_bf16.h.
std::string cuda_include_dir(const std::string& nvrtc_dir) {
  std::vector<std::string> dirs;
  if (!nvrtc_dir.empty()) dirs.push_back(nvrtc_dir + "/../include");
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) dirs.push_back(std::string(home) + "/include");
  dirs.push_back("/usr/local/cuda/include");
  for (const auto& d : dirs)
    if (access((d + "/cuda_fp16.h").c_str(), R_OK) == 0) return d;
  return "";
}

template <class F>
bool load_sym(void* h, const char* name, F& fn, std::string& missing) {
  void* p = dlsym(h, name);
  if (!p) {
    missing += std::string(missing.empty() ? "" : ", ") + name;
    return false;
  }
  fn = reinterpret_cast<F>(p);
  return true;
}

void load_nvrtc(NvrtcState& s) {
  std::string tried;
  void* h = nullptr;
  std::string path;
  for (const auto& cand : nvrtc_candidates()) {
    h = dlopen(cand.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h) {
      path = cand;
      break;
    }
    const char* e = dlerror();
    tried += "\n  " + cand + ": " + (e ? e : "dlopen failed");
  }
  if (!h) {
    s.status = Status::error(Code::kUnavailable, "NVRTC not found (set KERNELCRAFT_NVRTC); tried:" + tried);
    return;
  }
  NvrtcApi& a = s.api;
  std::string missing;
  load_sym(h, "nvrtcGetErrorString", a.nvrtcGetErrorString, missing);
  load_sym(h, "nvrtcVersion", a.nvrtcVersion, missing);
  load_sym(h, "nvrtcGetNumSupportedArchs", a.nvrtcGetNumSupportedArchs, missing);
  load_sym(h, "nvrtcGetSupportedArchs", a.nvrtcGetSupportedArchs, missing);
  load_sym(h, "nvrtcCreateProgram", a.nvrtcCreateProgram, missing);
  load_sym(h, "nvrtcDestroyProgram", a.nvrtcDestroyProgram, missing);
  load_sym(h, "nvrtcCompileProgram", a.nvrtcCompileProgram, missing);
  load_sym(h, "nvrtcGetProgramLogSize", a.nvrtcGetProgramLogSize, missing);
  load_sym(h, "nvrtcGetProgramLog", a.nvrtcGetProgramLog, missing);
  load_sym(h, "nvrtcGetCUBINSize", a.nvrtcGetCUBINSize, missing);
  load_sym(h, "nvrtcGetCUBIN", a.nvrtcGetCUBIN, missing);
  if (!missing.empty()) {
    s.api = NvrtcApi();
    s.status = Status::error(Code::kUnavailable, path + " is not a usable NVRTC (CUDA >= 11.1 needed), missing: " + missing);
    dlclose(h);
    return;
  }
  if (a.nvrtcVersion(&a.major, &a.minor) != 0) {
    s.api = NvrtcApi();
    s.status = Status::error(Code::kUnavailable, path + ": nvrtcVersion failed");
    dlclose(h);
    return;
  }
  a.path = path;
  const std::string dir = loaded_dir(h);
  preload_nvrtc_builtins(dir, a.major, a.minor);
  a.include_dir = cuda_include_dir(dir);
  log(LogLevel::kDebug, "NVRTC " + std::to_string(a.major) + "." + std::to_string(a.minor) + " from " + path);
}

}  // namespace

Result<const DriverApi*> cuda_driver() {
  static std::once_flag once;
  DriverState& s = driver_state();
  std::call_once(once, [&] { load_driver(s); });
  if (!s.status.is_ok()) return s.status;
  return &s.api;
}

Result<const NvrtcApi*> nvrtc_api() {
  static std::once_flag once;
  NvrtcState& s = nvrtc_state();
  std::call_once(once, [&] { load_nvrtc(s); });
  if (!s.status.is_ok()) return s.status;
  return &s.api;
}

std::string cu_error(const DriverApi& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  std::string out = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
  if (text) out += std::string(" (") + text + ")";
  return out;
}

ScopedContext::ScopedContext(const DriverApi& d, CUcontext ctx) : d_(d) {
  CUcontext cur = nullptr;
  CUresult r = d_.cuCtxGetCurrent(&cur);
  if (r == CUDA_SUCCESS && cur == ctx) return;
  r = d_.cuCtxPushCurrent(ctx);
  if (r != CUDA_SUCCESS) {
    status_ = Status::error(Code::kLaunchError, "cuCtxPushCurrent: " + cu_error(d_, r));
    return;
  }
  pushed_ = true;
}

ScopedContext::~ScopedContext() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  d_.cuCtxPopCurrent(&popped);  // failure leaves nothing to restore; nothing useful to report
}

}  // namespace kc
