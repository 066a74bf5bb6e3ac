// The one table of CUDA driver and NVRTC entry points, dlopen'ed on first use: nothing in
// kernelcraft links libcuda or libnvrtc, so the library loads on machines without a GPU driver.
// Internal to runtime/ and its tests (needs cuda.h on the include path).
#pragma once
#include <cuda.h>

#include <cstddef>
#include <string>

#include "runtime/status.h"

namespace kc {

// Every driver function kernelcraft calls. Names go through cuda.h's macros, so e.g. cuMemAlloc
// is cuMemAlloc_v2 here: the symbol looked up is exactly the ABI of the prototype in cuda.h.
#define KC_CUDA_DRIVER_FUNCS(X)                                                                  \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                          \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName)                  \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                                       \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                   \
  X(cuCtxGetDevice) X(cuCtxSynchronize)                                                          \
  X(cuStreamGetCtx) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                  \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)                                                \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                                   \
  X(cuFuncGetAttribute) X(cuFuncSetAttribute) X(cuLaunchKernel)                                  \
  X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8Async)  \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)

struct DriverApi {
#define KC_CUDA_DECLARE(fn) decltype(&::fn) fn = nullptr;
  KC_CUDA_DRIVER_FUNCS(KC_CUDA_DECLARE)
#undef KC_CUDA_DECLARE
};

// The driver table, loaded once (thread-safe). kUnavailable if libcuda.so.1 is absent or lacks a
// symbol; cuInit is NOT called here (cuda_backend does, so "no device" is its own message).
Result<const DriverApi*> cuda_driver();

// "CUDA_ERROR_INVALID_VALUE (invalid argument)" for a driver result code.
std::string cu_error(const DriverApi& d, CUresult r);

// Makes `ctx` current for a scope (pushes it unless it already is; pops on exit), so a caller's
// own current context is left as it was found.
class ScopedContext {
 public:
  ScopedContext(const DriverApi& d, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  const Status& status() const { return status_; }

 private:
  const DriverApi& d_;
  bool pushed_ = false;
  Status status_;
};

// NVRTC, declared here because nvrtc.h need not be installed. Result codes are ints
// (0 = NVRTC_SUCCESS); the program handle is opaque.
using NvrtcProgram = struct _nvrtcProgram*;
struct NvrtcApi {
  const char* (*nvrtcGetErrorString)(int) = nullptr;
  int (*nvrtcVersion)(int* major, int* minor) = nullptr;
  int (*nvrtcGetNumSupportedArchs)(int* n) = nullptr;
  int (*nvrtcGetSupportedArchs)(int* archs) = nullptr;
  int (*nvrtcCreateProgram)(NvrtcProgram* prog, const char* src, const char* name, int num_headers,
                            const char* const* headers, const char* const* include_names) = nullptr;
  int (*nvrtcDestroyProgram)(NvrtcProgram* prog) = nullptr;
  int (*nvrtcCompileProgram)(NvrtcProgram prog, int num_options, const char* const* options) = nullptr;
  int (*nvrtcGetProgramLogSize)(NvrtcProgram prog, size_t* size) = nullptr;
  int (*nvrtcGetProgramLog)(NvrtcProgram prog, char* log) = nullptr;
  int (*nvrtcGetCUBINSize)(NvrtcProgram prog, size_t* size) = nullptr;
  int (*nvrtcGetCUBIN)(NvrtcProgram prog, char* cubin) = nullptr;
  std::string path;   // the library that was loaded
  int major = 0, minor = 0;
  // A CUDA include directory holding cuda_fp16.h / cuda_bf16.h (NVRTC has no built-in copy):
  // ../include next to the library, $CUDA_HOME/include or /usr/local/cuda/include; may be empty.
  std::string include_dir;
};

// The NVRTC table, loaded once. Search order: Config nvrtc_path; libnvrtc.so.13, .so.12, .so;
// the nvidia wheels next to a loaded torch (../../nvidia/cu13/lib, ../../nvidia/cuda_nvrtc/lib
// relative to torch/lib), the same relative to the torch this library was built against; then
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64. kUnavailable lists every place tried.
Result<const NvrtcApi*> nvrtc_api();

}  // namespace kc
