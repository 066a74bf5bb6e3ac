// CUDA backend: CUDA source -> NVRTC -> CUBIN for the device's architecture -> cuModuleLoadData in
// the primary context -> cuLaunchKernel on the caller's stream. Driver and NVRTC are loaded lazily
// (runtime/cuda_api.h), so nothing here needs a GPU until a CUDA backend is asked for.
#pragma once
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace kc {

// The backend for CUDA device `device` (an ordinal). kUnavailable without a driver or NVRTC.
// Created once per device (failures are remembered too) and never destroyed.
Result<Backend*> cuda_backend(int device);

// "Is CUDA usable on this device": ok, or kUnavailable with the reason (no libcuda, no device,
// no NVRTC). Never crashes on machines without a driver.
Status cuda_available(int device);

// Compiles CUDA source for an explicit architecture (e.g. 90 for sm_90) without touching a GPU;
// used by CI to check every shipped CUDA source and by the cuda backend itself.
Result<CompileOutput> nvrtc_compile(const std::string& source, int sm_arch);

// Per-entry resource use of a CUBIN on `device`: registers, static shared memory, local memory
// (spills), the largest block the kernel can launch with. {"entry": {"registers": n, ...}, ...}
Result<std::string> cuda_resources_json(int device, const std::string& cubin, const std::vector<std::string>& entries);

// "13.0" etc., or kUnavailable if NVRTC cannot be loaded.
Result<std::string> nvrtc_version();

}  // namespace kc
