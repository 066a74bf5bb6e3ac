// The live check's CUDA comparison kernel: its source, its file, its build (live_compare.h).
#include "kernel_cache/live_compare.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>

#include "kernel_cache/key.h"
#include "kernel_cache/manual.h"
#include "runtime/fsutil.h"
#include "runtime/log.h"

namespace kc {

namespace {

// No headers: NVRTC may have no CUDA include directory, so 16-bit values are widened by hand
// (bf16: the top half of a float; fp16: the PTX conversion).
const char* const kSource = R"CUDA(
__device__ __forceinline__ double kc_wide(float v) { return v; }
__device__ __forceinline__ double kc_wide(double v) { return v; }
struct kc_f16 { unsigned short bits; };
struct kc_bf16 { unsigned short bits; };
__device__ __forceinline__ double kc_wide(kc_f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ double kc_wide(kc_bf16 v) { return __uint_as_float((unsigned)v.bits << 16); }

// Block-wide sum or max of one double per thread (blockDim.x a multiple of 32, at most 1024).
template <bool kMax>
__device__ double kc_block(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) {
    const double w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmax(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) {
      const double w = __shfl_xor_sync(0xffffffffu, v, o);
      v = kMax ? fmax(v, w) : v + w;
    }
  return v;
}

extern "C" __global__ void kc_live_zero(double* acc) {
  if (threadIdx.x < 4) acc[threadIdx.x] = 0.0;
}

template <typename T>
__device__ void kc_sum(double* acc, const T* r, long long n) {
  double s = 0.0, bad = 0.0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const double v = kc_wide(r[i]);
    if (isfinite(v)) s += fabs(v);
    else bad += 1.0;
  }
  s = kc_block<false>(s);
  __syncthreads();
  bad = kc_block<false>(bad);
  if (threadIdx.x == 0) {
    atomicAdd(&acc[0], s);
    atomicAdd(&acc[1], bad);
  }
}

template <typename T>
__device__ void kc_err(double* acc, const T* x, const T* r, long long n) {
  const double tau = fmax(0.1 * acc[0] / (double)n, 1.1754943508222875e-38);
  double m = 0.0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const double a = kc_wide(x[i]), b = kc_wide(r[i]);
    double e = fabs(a - b) / (fabs(b) + tau);
    if (!(e <= 1.7976931348623157e308)) e = __longlong_as_double(0x7ff0000000000000LL);   // NaN, inf: +inf
    m = fmax(m, e);
  }
  m = kc_block<true>(m);
  // Non-negative doubles order as their bit patterns do.
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned long long*>(&acc[2]), (unsigned long long)__double_as_longlong(m));
}

#define KC_LIVE(T, S)                                                                                    \
  extern "C" __global__ void kc_live_sum_##S(double* acc, const T* r, long long n) { kc_sum(acc, r, n); } \
  extern "C" __global__ void kc_live_err_##S(double* acc, const T* x, const T* r, long long n) { kc_err(acc, x, r, n); }
KC_LIVE(float, f32)
KC_LIVE(double, f64)
KC_LIVE(kc_f16, f16)
KC_LIVE(kc_bf16, bf16)
)CUDA";

std::string file_name(const std::string& target) {
  std::string s;
  for (char c : target) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return s + ".cubin";
}

}  // namespace

const std::string& live_compare_source() {
  static const std::string s = kSource;
  return s;
}

std::string live_compare_path(const std::string& dir, const std::string& target) {
  return dir + "/live-check/" + file_name(target);
}

Status ensure_live_compare(const std::string& dir, const std::string& target) {
  auto t = parse_target(target);
  if (!t || t->kind != BackendKind::kCuda) return Status::error(Code::kInvalid, "not a CUDA target: " + target);
  const std::string path = live_compare_path(dir, target);
  if (path_exists(path)) return Status::ok();
  auto out = compile_for_target(target, live_compare_source(), nullptr);
  if (!out) return out.status();
  if (!make_dirs(dir + "/live-check")) return Status::error(Code::kIOError, "cannot create " + dir + "/live-check");
  // Written under a private name, then renamed: a reader sees the whole file or none.
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  if (!write_file(tmp, out->binary) || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::error(Code::kIOError, "cannot write " + path);
  }
  return Status::ok();
}

void ensure_live_compare_for(const std::string& dir, const Record& r) {
  if (r.state != RecordState::kServed || r.backend != BackendKind::kCuda) return;
  const std::string target = key_target(r.key);
  if (Status s = ensure_live_compare(dir, target); !s)
    log_once(LogLevel::kDebug, "live-compare:" + target, "no live-check kernel for " + target + ": " + s.to_string());
}

Result<std::string> read_live_compare(const std::string& dir, const std::string& target) {
  bool ok = false;
  std::string b = read_file(live_compare_path(dir, target), &ok);
  if (!ok || b.empty()) return Status::error(Code::kNotFound, "no live-check kernel for " + target + " in " + dir);
  return b;
}

}  // namespace kc
