// The live check's comparison kernel for CUDA outputs (dispatcher/shadow.h), kept in the cache
// directory beside the records it checks: `<dir>/live-check/<target>.cubin`, one per CUDA target.
//
// Why a kernel of our own: the comparison written with ATen ops launches about ten distinct ATen
// kernels, and CUDA loads each kernel's module lazily on its first launch, so a process's first
// check cost ~80 ms on an H200 (4 ms with CUDA_MODULE_LOADING=EAGER). One small module built here
// costs one load. It is built with NVRTC (no GPU needed) wherever a CUDA record is stored: the
// worker's winners, `cache put`, put_kernel, `cache import`; a process whose cache has no copy
// compares with ATen ops instead. The file is as trusted as the records beside it: whoever can
// write the cache directory can already change what is served.
//
// Entry points (each T in f32, f64, f16, bf16; acc is 4 doubles of device memory):
//   kc_live_zero(double* acc)                            <<<1, 32>>>  acc[0..3] = 0
//   kc_live_sum_<T>(double* acc, const T* r, i64 n)      acc[0] += sum of finite |r|, acc[1] += non-finite count
//   kc_live_err_<T>(double* acc, const T* x, const T* r, i64 n)
//       acc[2] = max over i of |x - r| / (|r| + tau) as the bits of a double, tau = max(0.1 acc[0] / n,
//       FLT_MIN); a NaN or infinite term counts as +inf. Launched after kc_live_sum_<T> on one stream.
#pragma once
#include <string>

#include "kernel_cache/record.h"
#include "runtime/status.h"

namespace kc {

// The comparison kernel's CUDA source.
const std::string& live_compare_source();

// Where the CUBIN for `target` (a key's target field, "cuda-sm_90+...") lives under `dir`.
std::string live_compare_path(const std::string& dir, const std::string& target);

// Builds and writes the CUBIN for `target` unless `dir` already has it. ok when it is there
// afterwards; an error (no NVRTC, a read-only directory) leaves the ATen comparison in use.
Status ensure_live_compare(const std::string& dir, const std::string& target);

// ensure_live_compare for a record just stored: only served CUDA records need the kernel; any
// other record is ok at once. Failures are logged at debug level (live checks then use ATen ops).
void ensure_live_compare_for(const std::string& dir, const Record& r);

// The stored CUBIN for `target`, or kNotFound.
Result<std::string> read_live_compare(const std::string& dir, const std::string& target);

}  // namespace kc
