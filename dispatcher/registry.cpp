// register_ops: one torch::Library per (backend key, op), created at run time so that the set of
// intercepted ops comes from the configuration rather than from static initialisers.
#include "dispatcher/registry.h"

#include <mutex>

#include "dispatcher/state.h"
#include "runtime/fork.h"
#include "runtime/log.h"

namespace kc::dispatch {

void register_ops(const std::vector<std::string>& ops) {
  static constinit PerFork<std::mutex> mu;   // one per process: runtime/fork.h
  std::lock_guard<std::mutex> g(mu.get());
  State& st = State::get();
  for (const auto& name : ops) {
    auto id = op_by_name(name);
    if (!id || st.registered(*id)) continue;
    try {
      // Leaked on purpose: destroying a Library deregisters, which must not happen at exit while
      // the interpreter may still run ops.
      auto* cpu = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
      register_cpu(*cpu, *id);
#ifdef KC_WITH_CUDA
      auto* cuda = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA, __FILE__, __LINE__);
      register_cuda(*cuda, *id);
#endif
      st.set_registered(*id);
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, std::string("could not intercept ") + name + ": " + e.what());
    }
  }
}

}  // namespace kc::dispatch
