// CPU backend: C++ source -> host compiler -> shared object (stored as bytes) -> dlopen.
//
// Kernel ABI (the CPU twin of a CUDA __global__ function and cuLaunchKernel's kernelParams):
//   extern "C" void <entry>(const kc_cpu_ctx* ctx, void* const* args);
// args[i] points at the i-th parameter's value (for ptr: at a void* holding the data pointer).
// The grid is split into linear block ranges [ctx->begin, ctx->end) run in parallel; the kernel
// loops over its blocks. kc_cpu.h (prepended to every source) declares kc_cpu_ctx.
#pragma once
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/binary_check.h"

namespace kc {

// Process-wide CPU backend. Compiler: KERNELCRAFT_CXX or "c++"; flags fixed (-O3 -shared -fPIC
// -nostartfiles ...); every load passes check_cpu_binary first.
Backend& cpu_backend();

// Compiles with the backend's flags plus `extra_flags` (e.g. -fsanitize=address for the gauntlet's
// sanitizer stage); what Backend::compile does with none.
Result<CompileOutput> cpu_compile(const std::string& source, const std::vector<std::string>& extra_flags);

// Checks `binary` (binary_check.h) under `policy`, then loads it; what Backend::load does with
// kKernel. The sanitizer runner loads AddressSanitizer builds with kSanitizerBuild.
Result<std::unique_ptr<Launcher>> cpu_load(const std::string& binary, const ResolvedSpec& spec, BinaryPolicy policy);

// The prelude prepended to every CPU kernel source before compiling.
const char* cpu_kernel_prelude();

}  // namespace kc
