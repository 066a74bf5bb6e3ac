// A LibTorch C++ program with kernelcraft linked in: no Python, same interception.
// Build: part of the CMake build (target kc_libtorch_demo). Run: ./examples/kc_libtorch_demo
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdio>
#include <string>

int main() {
  auto status = c10::Dispatcher::singleton().findSchemaOrThrow("kernelcraft::status", "")
                    .typed<std::string()>();
  auto reset = c10::Dispatcher::singleton().findSchemaOrThrow("kernelcraft::reset_counters", "")
                   .typed<void()>();
  reset.call();
  at::Tensor x = at::randn({64, 128});
  at::Tensor y = at::relu(x);
  at::Tensor z = at::softmax(y, 1);
  std::string s = status.call();   // before the checks below, whose sum kernelcraft intercepts too
  bool ok = at::equal(y, x.clamp_min(0)) && at::allclose(z.sum(1), at::ones({64}));
  std::printf("%s\n", s.c_str());
  // the two calls must have been intercepted (as misses on a fresh cache)
  bool seen = s.find("\"relu\"") != std::string::npos && s.find("\"calls\":2") != std::string::npos;
  std::printf("results %s, interception %s\n", ok ? "ok" : "WRONG", seen ? "seen" : "NOT SEEN");
  return ok && seen ? 0 : 1;
}
