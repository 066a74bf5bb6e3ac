// kernelcraft-sanitize <bundle-dir>: runs one candidate once, alone, with every buffer allocated at
// its exact size, so compute-sanitizer (CUDA) or AddressSanitizer (CPU, runtime preloaded) sees
// any access past a tensor's end. Torch-free on purpose: it starts fast under the sanitizers and
// has no caching allocator that would hide out-of-bounds accesses inside a larger block.
// Bundle (written by the gauntlet): call.json, launch.json, kernel.bin, in<k>.bin per input.
// Held to the evaluation child's rules: the sandbox (evolve/verify/sandbox.h) closes after the bundle is
// read and before the candidate is loaded.
// Exit: 0 ran cleanly; 3 the launch or the device reported an error; 2 a bad bundle; 4 the
// candidate made a system call the sandbox denied.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "evolve/ops/op_call.h"
#include "evolve/verify/sandbox.h"
#include "runtime/config.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_backend.h"
#include "runtime/fsutil.h"
#include "runtime/launch_spec.h"

namespace {

int fail(int code, const std::string& msg) {
  std::fprintf(stderr, "kernelcraft-sanitize: %s\n", msg.c_str());
  return code;
}

// A buffer of n bytes whose start has exactly the alignment class `align` (runtime/tensor_meta.h)
// and whose end is the end of the allocation, so AddressSanitizer's redzone sits right after it.
struct AlignedBuffer {
  void* base = nullptr;
  char* data = nullptr;
  AlignedBuffer(size_t n, int align) {
    const size_t off = static_cast<size_t>(std::clamp(align, 1, kc::kMaxAlignClass));
    if (posix_memalign(&base, kc::kAlignSpan, off + n) == 0) data = static_cast<char*>(base) + off;
  }
  ~AlignedBuffer() { std::free(base); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

// Closes the sandbox for a candidate of this backend; says so on stderr when the filter is missing.
void sandbox_self(bool cuda) {
  kc::evolve::SandboxPolicy p =
      kc::evolve::sandbox_policy(kc::load_config().evolve_sandbox, cuda, kc::evolve::kRunnerCpuSeconds);
  if (kc::Status s = kc::evolve::apply_sandbox(p); !s)
    std::fprintf(stderr, "kernelcraft-sanitize: sandbox: %s; resource limits only\n", s.message().c_str());
}

// Exit 4 when the candidate tried something the sandbox denied (the call itself did not happen).
int check_sandbox(int code_otherwise) {
  auto v = kc::evolve::take_sandbox_violation();
  if (!v) return code_otherwise;
  std::fprintf(stderr, "kernelcraft-sanitize: ERROR: sandbox: the kernel attempted a forbidden system call: %s (%lld times, denied)\n",
               v->name.c_str(), static_cast<long long>(v->attempts));
  return 4;
}

// The bundle's call, its launch spec resolved for the call, and the binary (sanitizers.h).
struct Bundle {
  std::string dir;
  kc::evolve::OpCall call;
  kc::Binding binding;
  kc::ResolvedSpec spec;
  std::string binary;
};

// 0, or the exit status for a bundle that cannot be read.
int load_bundle(const std::string& dir, Bundle& out) {
  bool ok1, ok2, ok3;
  std::string call_text = kc::read_file(dir + "/call.json", &ok1), launch_text = kc::read_file(dir + "/launch.json", &ok2);
  out.binary = kc::read_file(dir + "/kernel.bin", &ok3);
  if (!ok1 || !ok2 || !ok3) return fail(2, "incomplete bundle in " + dir);
  auto cj = nlohmann::json::parse(call_text, nullptr, false);
  auto lj = nlohmann::json::parse(launch_text, nullptr, false);
  if (cj.is_discarded() || lj.is_discarded()) return fail(2, "bundle json does not parse");
  auto call = kc::evolve::call_from_json(cj);
  if (!call) return fail(2, call.status().to_string());
  auto spec = kc::parse_launch_spec(lj);
  if (!spec) return fail(2, spec.status().to_string());
  out.dir = dir;
  out.call = std::move(call.value());
  out.binding = out.call.binding();
  auto rs = kc::resolve(spec.value(), out.binding);
  if (!rs) return fail(2, rs.status().to_string());
  out.spec = std::move(rs.value());
  return 0;
}

// Input k's bytes from the bundle; false unless it has exactly n of them.
bool read_input(const Bundle& b, size_t k, size_t n, std::string& data) {
  bool ok;
  data = kc::read_file(b.dir + "/in" + std::to_string(k) + ".bin", &ok);
  return ok && data.size() == n;
}

// An AddressSanitizer build (its instrumentation imports __asan_* and has a module constructor)
// over buffers of exactly the key's sizes and alignment, ASan's redzones right after them.
int run_cpu(const Bundle& b) {
  auto ld = kc::cpu_load(b.binary, b.spec, kc::BinaryPolicy::kSanitizerBuild);
  if (!ld) return check_sandbox(fail(3, ld.status().to_string()));
  if (int rc = check_sandbox(0); rc != 0) return rc;   // load-time code (constructors) ran
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  std::vector<void*> ptrs;
  for (size_t k = 0; k < b.binding.tensors.size(); ++k) {
    const kc::TensorMeta& m = b.binding.tensors[k];
    size_t n = static_cast<size_t>(kc::extent_bytes(m));
    if (!m.defined || n == 0) {
      ptrs.push_back(nullptr);
      continue;
    }
    bufs.push_back(std::make_unique<AlignedBuffer>(n, m.align));
    if (!bufs.back()->data) return fail(2, "out of memory");
    if (k < b.call.inputs.size()) {
      std::string data;
      if (!read_input(b, k, n, data)) return fail(2, "input " + std::to_string(k) + " has the wrong size");
      std::memcpy(bufs.back()->data, data.data(), n);
    }
    ptrs.push_back(bufs.back()->data);
  }
  for (int64_t s : b.spec.scratch_bytes) {
    bufs.push_back(std::make_unique<AlignedBuffer>(static_cast<size_t>(s > 0 ? s : 1), kc::kMaxAlignClass));
    if (!bufs.back()->data) return fail(2, "out of memory");
    ptrs.push_back(bufs.back()->data);
  }
  kc::Status st = ld.value()->run(ptrs.data(), kc::ExecContext{});
  if (!st) return check_sandbox(fail(3, st.to_string()));
  if (int rc = check_sandbox(0); rc != 0) return rc;
  std::printf("ok\n");
  return 0;
}

// Under compute-sanitizer: device buffers that end where the key's extent ends (memcheck's bound).
int run_cuda(const Bundle& b) {
  int device = 0;
  if (const char* d = std::getenv("KERNELCRAFT_DEVICE")) device = std::atoi(d);
  auto be = kc::cuda_backend(device);
  if (!be) return fail(2, be.status().to_string());
  auto ld = be.value()->load(b.binary, b.spec);
  if (!ld) return fail(3, ld.status().to_string());
  const kc::DriverApi& d = *kc::cuda_driver().value();
  CUdevice dev;
  CUcontext ctx = nullptr;
  if (d.cuDeviceGet(&dev, device) != CUDA_SUCCESS || d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    return fail(2, "no primary context");
  kc::ScopedContext scope(d, ctx);
  std::vector<void*> ptrs;
  std::vector<CUdeviceptr> allocs;
  // cuMemAlloc's start is 256-aligned; the buffer starts `align` bytes in, so its address has
  // exactly the key's alignment class and its end is the allocation's end.
  auto alloc = [&](size_t n, int align) -> void* {
    CUdeviceptr p = 0;
    if (n == 0) return nullptr;
    const size_t off = static_cast<size_t>(std::clamp(align, 1, kc::kMaxAlignClass));
    if (d.cuMemAlloc(&p, off + n) != CUDA_SUCCESS) return nullptr;
    allocs.push_back(p);
    return reinterpret_cast<void*>(p + off);
  };
  for (size_t k = 0; k < b.binding.tensors.size(); ++k) {
    size_t n = static_cast<size_t>(kc::extent_bytes(b.binding.tensors[k]));
    void* p = alloc(n, b.binding.tensors[k].align);
    if (n && !p) return fail(2, "cuMemAlloc failed");
    if (k < b.call.inputs.size() && n) {
      std::string data;
      if (!read_input(b, k, n, data)) return fail(2, "input " + std::to_string(k) + " has the wrong size");
      if (d.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(p), data.data(), n) != CUDA_SUCCESS) return fail(2, "copy failed");
    }
    ptrs.push_back(p);
  }
  for (int64_t s : b.spec.scratch_bytes) ptrs.push_back(alloc(static_cast<size_t>(s), kc::kMaxAlignClass));
  kc::Status st = ld.value()->run(ptrs.data(), kc::ExecContext{});
  if (!st) return fail(3, st.to_string());
  CUresult r = d.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return fail(3, "device error: " + kc::cu_error(d, r));
  for (CUdeviceptr p : allocs) d.cuMemFree(p);
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail(2, "usage: kernelcraft-sanitize <bundle-dir>");
  Bundle b;
  if (int rc = load_bundle(argv[1], b); rc != 0) return rc;
  const bool cuda = b.call.backend == kc::BackendKind::kCuda;
  sandbox_self(cuda);
  return cuda ? run_cuda(b) : run_cpu(b);
}
