// Per-call overhead of kernelcraft on a tiny op, in C++ so Python's own noise stays out.
//   kc_overhead --device cpu|cuda [--lib path/to/libkernelcraft.so] [--mode miss|hit] [--n 1024]
// Without --lib the library is not loaded at all (the baseline). --mode hit puts the example relu
// kernel into a fresh cache first. --direct launches that same kernel through the runtime backend
// without the dispatcher (the hit's reference). Prints one JSON line: median ns per call.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifdef KC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void sync(bool cuda) {
#ifdef KC_WITH_CUDA
  if (cuda) at::cuda::getCurrentCUDAStream().synchronize();
#endif
}

template <class F>
double median_ns_per_call(F&& f, bool cuda, int calls = 2000, int reps = 31) {
  for (int i = 0; i < calls; ++i) f();   // warm-up
  sync(cuda);
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    sync(cuda);
    auto t1 = std::chrono::steady_clock::now();
    v.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string kc_status() {
  return c10::Dispatcher::singleton().findSchemaOrThrow("kernelcraft::status", "").typed<std::string()>().call();
}
void kc_reset() {
  c10::Dispatcher::singleton().findSchemaOrThrow("kernelcraft::reset_counters", "").typed<void()>().call();
}

// The example relu's spec resolved for a contiguous float tensor of n elements.
kc::ResolvedSpec relu_spec(int64_t n, const std::string& spec_text) {
  kc::Binding b;
  kc::TensorMeta t;
  t.name = "self";
  t.sizes = {n};
  t.strides = {1};
  b.tensors.push_back(t);
  t.name = "out0";
  b.tensors.push_back(t);
  return kc::resolve(kc::parse_launch_spec(nlohmann::json::parse(spec_text)).value(), b).value();
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", lib, mode = "miss", kernels = KC_SOURCE_DIR "/examples/kernels";
  int64_t n = 1024;
  bool direct = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device") device = argv[++i];
    else if (a == "--lib") lib = argv[++i];
    else if (a == "--mode") mode = argv[++i];
    else if (a == "--n") n = std::atoll(argv[++i]);
    else if (a == "--direct") direct = true;
    else if (a == "--compile-times") mode = "compile";
  }
  bool cuda = device == "cuda";
  at::Tensor x = at::randn({n}, at::TensorOptions().device(cuda ? at::kCUDA : at::kCPU));
  std::string suffix = cuda ? "cuda" : "cpu";
  std::string src = slurp(kernels + "/relu_" + suffix + (cuda ? ".cu" : ".cpp"));
  std::string spec_text = slurp(kernels + "/relu_" + suffix + ".json");

  if (mode == "compile") {
    // NVRTC compile (source -> CUBIN) and module load (CUBIN -> CUfunction), medians of 10.
    kc::Backend* be = kc::cuda_backend(0).value();
    std::vector<double> comp, load;
    kc::ResolvedSpec spec = relu_spec(n, spec_text);
    for (int i = 0; i < 10; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      auto bin = be->compile(src + "\n// variant " + std::to_string(i) + "\n");
      auto t1 = std::chrono::steady_clock::now();
      auto l = be->load(bin->binary, spec);
      auto t2 = std::chrono::steady_clock::now();
      if (!l) { std::fprintf(stderr, "%s\n", l.status().to_string().c_str()); return 1; }
      comp.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      load.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    std::sort(comp.begin(), comp.end());
    std::sort(load.begin(), load.end());
    std::printf("{\"device\":\"cuda\",\"mode\":\"compile\",\"nvrtc_compile_ms_median\":%.2f,"
                "\"nvrtc_compile_ms_min\":%.2f,\"module_load_ms_median\":%.3f,\"target\":\"%s\"}\n",
                comp[5], comp[0], load[5], be->target_id().c_str());
    return 0;
  }

  if (direct) {
    // The same kernel, compiled and loaded by the runtime backend, launched without the dispatcher.
    kc::Backend* be = nullptr;
    if (cuda) be = kc::cuda_backend(0).value();
    else be = &kc::cpu_backend();
    auto bin = be->compile(src);
    if (!bin) { std::fprintf(stderr, "%s\n", bin.status().to_string().c_str()); return 1; }
    kc::ResolvedSpec spec = relu_spec(n, spec_text);
    auto launcher = std::move(be->load(bin->binary, spec).value());
    kc::ExecContext ctx;
#ifdef KC_WITH_CUDA
    if (cuda) ctx.stream = at::cuda::getCurrentCUDAStream().stream();
#endif
    double ns = median_ns_per_call([&] {
      at::Tensor out = at::empty_like(x);
      void* ptrs[2] = {x.data_ptr(), out.data_ptr()};
      (void)launcher->run(ptrs, ctx);
    }, cuda);
    std::printf("{\"device\":\"%s\",\"mode\":\"direct\",\"n\":%lld,\"ns_per_call\":%.1f}\n", device.c_str(),
                (long long)n, ns);
    return 0;
  }

  if (!lib.empty()) {
    // The hit mode stores relu by hand (unverified); serve it so the hot path is what is timed.
    setenv("KERNELCRAFT_SERVE_UNVERIFIED", "1", 0);
    if (!dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL)) { std::fprintf(stderr, "%s\n", dlerror()); return 1; }
    if (mode == "hit") {
      at::relu(x);
      auto keys = c10::Dispatcher::singleton().findSchemaOrThrow("kernelcraft::missed_keys", "")
                      .typed<std::vector<std::string>()>().call();
      std::string key;
      for (auto& k : keys) if (k.find("aten::relu") != std::string::npos) key = k;
      c10::Dispatcher::singleton().findSchemaOrThrow("kernelcraft::put_kernel", "")
          .typed<std::string(std::string, std::string, std::string, bool)>().call(key, src, spec_text, false);
      at::relu(x);   // loads
    }
    kc_reset();
  }
  double ns = median_ns_per_call([&] { (void)at::relu(x); }, cuda);
  nlohmann::json total = nullptr;
  if (!lib.empty()) total = nlohmann::json::parse(kc_status())["total"];
  std::printf("{\"device\":\"%s\",\"mode\":\"%s\",\"n\":%lld,\"ns_per_call\":%.1f,\"counters\":%s}\n",
              device.c_str(), lib.empty() ? "no_library" : mode.c_str(), (long long)n, ns, total.dump().c_str());
  return 0;
}
