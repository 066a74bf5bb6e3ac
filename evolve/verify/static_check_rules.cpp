// The rules of the static source check (static_check_rules.h); the scanner is static_check.cpp.
#include "evolve/verify/static_check_rules.h"

namespace kc::evolve::rules {

// clang-format off
const Rule kRules[] = {
  // (1) D26/D27: state that outlives a launch can replay a stored output or drift after N calls.
  {"device-state", Back::kBoth, View::kCode, Check::kDeviceState, nullptr, "error", When::kAlways,
   "mutable state that survives launches (namespace-scope __device__/__managed__ or static variable): D26/D27"},
  // ... and the same declared in PTX: a module-scope `.global` variable in inline asm (`ld.global.f32`
  // and the like, instructions, have no space after the state space).
  {"device-state", Back::kCuda, View::kQuoted, Check::kRegex,
   R"((^|[^\w.])\.global\s+(\.align\s+\d+\s+)?\.(b|u|s|f)(8|16|32|64)\b)", "error", When::kAlways,
   "a .global variable declared in inline PTX: mutable state that survives launches (D26/D27)"},
  // (2) D19/D20/D21: precision the policy forbids.
  {"reduced-precision", Back::kBoth, View::kCode, Check::kRegex,
   R"(\b(__half2?|__half_raw|__half2_raw|__float2half\w*|__half2float|__floats2half2\w*|__half22float2|__low2half|__high2half|__h(add|sub|mul|div|fma|neg|abs|max|min|eq|ne|lt|gt|le|ge)2?(_\w+)?|_Float16|__fp16|_cvtss_sh|_cvtsh_ss|_mm\d*_cvtps_ph|_mm\d*_cvtph_ps)\b|\bh2?(exp2?|exp10|log2?|log10|sqrt|rsqrt|rcp|sin|cos)\s*\(|\bhalf2?\s+[A-Za-z_]\w*\s*[=;,\)\[]|<\s*half2?\s*>)",
   "error", When::kNoFp16, "fp16 types or conversions on fp32 data: a silent precision downgrade (D19)"},
  {"reduced-precision", Back::kBoth, View::kQuoted, Check::kRegex, R"(\.f16(x2)?\b)",
   "error", When::kNoFp16, "fp16 PTX on fp32 data: a silent precision downgrade (D19)"},
  {"reduced-precision", Back::kBoth, View::kCode, Check::kRegex,
   R"(\b(__nv_bfloat16\w*|nv_bfloat16\w*|__float2bfloat16\w*|__bfloat162float|__floats2bfloat162\w*|__bf16|bfloat16|_mm\d*_cvtne2?ps2?_pbh|_mm\d*_dpbf16_ps)\b)",
   "error", When::kNoBf16, "bf16 types or conversions on fp32 data under a policy that forbids them (D19)"},
  {"reduced-precision", Back::kBoth, View::kQuoted, Check::kRegex, R"(\.bf16(x2)?\b)",
   "error", When::kNoBf16, "bf16 PTX on fp32 data under a policy that forbids it (D19)"},
  {"tensor-core", Back::kBoth, View::kCode, Check::kRegex,
   R"(\bwmma::|\bnvcuda::|\b__hmma\w*|\b(mma_sync|load_matrix_sync|store_matrix_sync|__float_to_tf32|wgmma\w*)\b|\b_tile_\w+\s*\()",
   "error", When::kNoTensorCore, "tensor-core / TF32 math under the fp32 policy: ~10 mantissa bits (D20)"},
  {"tensor-core", Back::kBoth, View::kQuoted, Check::kRegex, R"(\b(w?mma|wgmma)\.|\bldmatrix\b|\.tf32\b)",
   "error", When::kNoTensorCore, "tensor-core / TF32 PTX under the fp32 policy (D20)"},
  {"fast-math", Back::kCuda, View::kCode, Check::kRegex,
   R"(\b__(expf|exp10f|logf|log2f|log10f|sinf|cosf|sincosf|tanf|powf|fdividef|saturatef)\b)",
   "error", When::kFloatData, "approximate fast-math intrinsic: wrong denormals, extremes and NaN handling (D21)"},
  {"fast-math", Back::kBoth, View::kQuoted, Check::kRegex, R"(\.approx\b|\.ftz\b)",
   "error", When::kFloatData, "approximate or flush-to-zero PTX instruction (D21)"},
  {"fast-math", Back::kBoth, View::kQuoted, Check::kRegex,
   R"(fast-?math|Ofast|unsafe-math|finite-math|associative-math|reciprocal-math|no-signed-zeros|reassociate|denormal-fp-math)",
   "error", When::kFloatData, "fast-math pragma or attribute (D21)"},
  {"fast-math", Back::kCpu, View::kCode, Check::kRegex,
   R"(\b(_mm_setcsr|_MM_SET_FLUSH_ZERO_MODE|_MM_SET_DENORMALS_ZERO_MODE|__builtin_ia32_ldmxcsr|fesetround|fesetenv|feholdexcept|feupdateenv|_mm\d*_(rcp|rsqrt)(14|28)?_[ps]s)\b)",
   "error", When::kFloatData, "flush-to-zero, rounding-mode change or approximate reciprocal on the CPU (D21)"},
  // (3) D28: a kernel must not observe time.
  {"timer", Back::kCuda, View::kCode, Check::kRegex, R"(\bclock(64)?\s*\(|\b__globaltimer\w*)",
   "error", When::kAlways, "reads a clock: kernels must not observe time (D28)"},
  {"timer", Back::kBoth, View::kQuoted, Check::kRegex, R"(%globaltimer|%clock|\brdtscp?\b|\brdpmc\b|cntvct_el0)",
   "error", When::kAlways, "reads a clock in inline asm: kernels must not observe time (D28)"},
  {"timer", Back::kCpu, View::kCode, Check::kRegex,
   R"(\b(clock|time|clock_gettime|gettimeofday|timespec_get|__rdtscp?|_rdtsc|__builtin_ia32_rdtscp?|__builtin_readcyclecounter)\s*\(|\bchrono::)",
   "error", When::kAlways, "reads a clock: kernels must not observe time (D28)"},
  {"sleep", Back::kCuda, View::kCode, Check::kRegex, R"(\b__nanosleep\b)",
   "warning", When::kAlways, "sleeps on the device: nothing a kernel of these ops needs (D28)"},
  {"inline-asm", Back::kBoth, View::kCode, Check::kRegex, R"(\b(asm|__asm__|__asm)\b)",
   "warning", When::kAlways, "inline asm: hides semantics from the other rules; recorded for review"},
  // (4) D30: L2 residency and cache-policy tricks beat the L2 flush of the timing harness.
  {"l2-residency", Back::kCuda, View::kQuoted, Check::kRegex,
   R"(createpolicy|evict_last|evict_unchanged|L2::cache_hint|discard\.global|applypriority)",
   "error", When::kAlways, "L2 residency / cache-policy PTX: time below the memory floor (D30)"},
  {"l2-residency", Back::kCuda, View::kCode, Check::kRegex,
   R"(\b(cudaAccessPolicyWindow|accessPolicyWindow|cudaLimitPersistingL2CacheSize|__nv_associate_access_property|access_property|annotated_ptr|discard_memory|createpolicy\w*)\b)",
   "error", When::kAlways, "L2 residency / access-policy API: time below the memory floor (D30)"},
  {"l2-prefetch", Back::kCuda, View::kQuoted, Check::kRegex, R"(prefetch\.global\.L2)",
   "warning", When::kAlways, "explicit L2 prefetch: harmless under the harness's L2 flush, recorded (D30)"},
  // (5) D08: 32-bit index math wraps past 2^31 elements (error only when the call is that big).
  {"int32-index", Back::kCuda, View::kCode, Check::kInt32Index, nullptr, nullptr, When::kAlways,
   "32-bit index computed from blockIdx*blockDim wraps for tensors past 2^31 (or 2^32) elements (D08)"},
  // (6) D23/D25/D28/D29: host-side things device code must not do.
  {"include", Back::kBoth, View::kQuoted, Check::kInclude, nullptr, "error", When::kAlways,
   "#include outside the allowlist: kernels are self-contained device code (D23/D29)"},
  {"host-call", Back::kCpu, View::kCode, Check::kRegex,
   R"(\b(pthread_\w+|fork|vfork|system|popen|exec[lv]p?e?|dlopen|dlsym|dlmopen|fopen|freopen|open|openat|creat|getenv|secure_getenv|setenv|putenv|mmap|munmap|mprotect|syscall|ioctl|signal|sigaction|raise|kill|exit|_exit|abort|atexit|setjmp|longjmp|sched_\w+|prctl|ptrace|sleep|usleep|nanosleep|omp_\w+)\s*\(|\bstd::(thread|jthread|async|this_thread|atexit)\b|\b(constructor|destructor)\b\s*\)\s*\)|\b__builtin_(frame|return)_address\b|\bextern\b(?!\s*"[^"]*"))",
   "error", When::kAlways, "host call from a kernel (threads, processes, files, environment, load-time code, outside symbols): D23/D25/D28/D29"},
  {"host-call", Back::kCuda, View::kCode, Check::kRegex,
   R"(\bcuda[A-Z]\w*|\bcu(Launch|Mem|Stream|Ctx|Module|Graph|Event|Device|Func)\w*|<<<)",
   "error", When::kAlways, "CUDA runtime/driver API or a dynamic-parallelism launch in device code (D23/D25)"},
  {"grid-sync", Back::kCuda, View::kCode, Check::kRegex, R"(\bthis_grid\s*\(|\bgrid_group\b|\bthis_multi_grid\b)",
   "error", When::kAlways, "grid-wide sync needs a cooperative launch, which the runtime never makes: hangs or races (D04)"},
  {"openmp", Back::kCpu, View::kQuoted, Check::kRegex, R"(#\s*pragma\s+omp\b)",
   "warning", When::kAlways, "OpenMP pragma: ignored (no -fopenmp); parallelism belongs to the runtime's grid split"},
  {"alloc", Back::kBoth, View::kCode, Check::kRegex,
   R"(\b(malloc|calloc|realloc|aligned_alloc|posix_memalign|free)\s*\(|\bnew\b|\bdelete\b)",
   "warning", When::kAlways, "heap allocation inside a kernel: slow and fallible; use scratch buffers from the launch spec"},
  {"token-paste", Back::kBoth, View::kQuoted, Check::kRegex, R"(##)",
   "warning", When::kAlways, "token pasting can assemble names the other rules look for"},
};
// clang-format on

// Headers a kernel may include; everything else is an error. CPU kernels get kc_cpu.h prepended.
// The list is headers of plain computation: what a kernel may *call* from them is the other
// rules' business (host calls, clocks, threads, allocation), so an honest kernel that includes
// <vector> or <atomic> out of habit is judged by what it does.
const std::set<std::string> kCpuIncludes = {
    "math.h",   "stdint.h",    "stddef.h",   "string.h",   "float.h",   "stdbool.h", "limits.h", "stdlib.h",
    "assert.h", "inttypes.h",  "cmath",      "cstdint",    "cstddef",   "cstring",   "cfloat",   "climits",
    "cstdlib",  "cassert",     "cinttypes",  "algorithm",  "limits",    "type_traits", "utility", "numeric",
    "array",    "vector",      "atomic",     "functional", "tuple",     "bit",       "iterator", "initializer_list",
    "immintrin.h", "arm_neon.h"};
// CUDA (NVRTC with the toolkit's include directory): the fp16/bf16/mma headers are allowed because
// the precision rules judge the *use* of their types under the key's policy; cuda_runtime.h only
// declares things, and calling the runtime API from device code is the host-call rule's error.
const std::set<std::string> kCudaIncludes = {"cuda_fp16.h", "cuda_bf16.h", "mma.h", "cuda_runtime.h",
                                             "cooperative_groups.h", "cuda_pipeline.h"};

const size_t kNumRules = sizeof(kRules) / sizeof(kRules[0]);

}  // namespace kc::evolve::rules
