// kernelcraft-sanitize <bundle-dir>: runs one candidate once, alone, with every buffer allocated at
// its exact size, so compute-sanitizer (CUDA) or AddressSanitizer (CPU, runtime preloaded) sees
// any access past a tensor's end. Torch-free on purpose: it starts fast under the sanitizers and
// has no caching allocator that would hide out-of-bounds accesses inside a larger block.
// Bundle (written by the gauntlet): call.json, launch.json, kernel.bin, in<k>.bin per input.
// Held to the evaluation child's rules: the sandbox (evolve/sandbox.h) closes after the bundle is
// read and before the candidate is loaded.
// Exit: 0 ran cleanly; 3 the launch or the device reported an error; 2 a bad bundle; 4 the
// candidate made a system call the sandbox denied.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "evolve/op_call.h"
#include "evolve/sandbox.h"
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

// Bytes a tensor spans: (last reachable element + 1) * element size.
size_t extent_bytes(const kc::TensorMeta& m) {
  if (!m.defined) return 0;
  int64_t last = 0;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return 0;
    last += (m.sizes[d] - 1) * m.strides[d];
  }
  return static_cast<size_t>(last + 1) * kc::dtype_size(m.dtype);
}

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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail(2, "usage: kernelcraft-sanitize <bundle-dir>");
  const std::string dir = argv[1];
  bool ok1, ok2, ok3;
  std::string call_text = kc::read_file(dir + "/call.json", &ok1), launch_text = kc::read_file(dir + "/launch.json", &ok2),
              binary = kc::read_file(dir + "/kernel.bin", &ok3);
  if (!ok1 || !ok2 || !ok3) return fail(2, "incomplete bundle in " + dir);
  auto cj = nlohmann::json::parse(call_text, nullptr, false);
  auto lj = nlohmann::json::parse(launch_text, nullptr, false);
  if (cj.is_discarded() || lj.is_discarded()) return fail(2, "bundle json does not parse");
  auto call = kc::evolve::call_from_json(cj);
  if (!call) return fail(2, call.status().to_string());
  auto spec = kc::parse_launch_spec(lj);
  if (!spec) return fail(2, spec.status().to_string());
  kc::Binding b = call.value().binding();
  auto rs = kc::resolve(spec.value(), b);
  if (!rs) return fail(2, rs.status().to_string());
  const bool cuda = call.value().backend == "cuda";
  const size_t ninputs = call.value().inputs.size();

  sandbox_self(cuda);
  if (!cuda) {
    auto ld = kc::cpu_backend().load(binary, rs.value());
    if (!ld) return check_sandbox(fail(3, ld.status().to_string()));
    if (int rc = check_sandbox(0); rc != 0) return rc;   // load-time code (constructors) ran
    std::vector<std::unique_ptr<char[]>> bufs;
    std::vector<void*> ptrs;
    for (size_t k = 0; k < b.tensors.size(); ++k) {
      size_t n = extent_bytes(b.tensors[k]);
      if (!b.tensors[k].defined || n == 0) {
        ptrs.push_back(nullptr);
        continue;
      }
      bufs.emplace_back(new char[n]);   // exact size: ASan's redzones sit right after it
      if (k < ninputs) {
        bool ok;
        std::string data = kc::read_file(dir + "/in" + std::to_string(k) + ".bin", &ok);
        if (!ok || data.size() != n) return fail(2, "input " + std::to_string(k) + " has the wrong size");
        std::memcpy(bufs.back().get(), data.data(), n);
      }
      ptrs.push_back(bufs.back().get());
    }
    for (int64_t s : rs.value().scratch_bytes) {
      bufs.emplace_back(new char[s > 0 ? s : 1]);
      ptrs.push_back(bufs.back().get());
    }
    kc::Status st = ld.value()->run(ptrs.data(), kc::ExecContext{});
    if (!st) return check_sandbox(fail(3, st.to_string()));
    if (int rc = check_sandbox(0); rc != 0) return rc;
    std::printf("ok\n");
    return 0;
  }

  int device = 0;
  if (const char* d = std::getenv("KERNELCRAFT_DEVICE")) device = std::atoi(d);
  auto be = kc::cuda_backend(device);
  if (!be) return fail(2, be.status().to_string());
  auto ld = be.value()->load(binary, rs.value());
  if (!ld) return fail(3, ld.status().to_string());
  const kc::DriverApi& d = *kc::cuda_driver().value();
  CUdevice dev;
  CUcontext ctx = nullptr;
  if (d.cuDeviceGet(&dev, device) != CUDA_SUCCESS || d.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    return fail(2, "no primary context");
  kc::ScopedContext scope(d, ctx);
  std::vector<void*> ptrs;
  std::vector<CUdeviceptr> allocs;
  auto alloc = [&](size_t n) -> void* {
    CUdeviceptr p = 0;
    if (n == 0) return nullptr;
    if (d.cuMemAlloc(&p, n) != CUDA_SUCCESS) return nullptr;
    allocs.push_back(p);
    return reinterpret_cast<void*>(p);
  };
  for (size_t k = 0; k < b.tensors.size(); ++k) {
    size_t n = extent_bytes(b.tensors[k]);
    void* p = alloc(n);
    if (n && !p) return fail(2, "cuMemAlloc failed");
    if (k < ninputs && n) {
      bool ok;
      std::string data = kc::read_file(dir + "/in" + std::to_string(k) + ".bin", &ok);
      if (!ok || data.size() != n) return fail(2, "input " + std::to_string(k) + " has the wrong size");
      if (d.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(p), data.data(), n) != CUDA_SUCCESS) return fail(2, "copy failed");
    }
    ptrs.push_back(p);
  }
  for (int64_t s : rs.value().scratch_bytes) ptrs.push_back(alloc(static_cast<size_t>(s)));
  kc::Status st = ld.value()->run(ptrs.data(), kc::ExecContext{});
  if (!st) return fail(3, st.to_string());
  CUresult r = d.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return fail(3, "device error: " + kc::cu_error(d, r));
  for (CUdeviceptr p : allocs) d.cuMemFree(p);
  std::printf("ok\n");
  return 0;
}
