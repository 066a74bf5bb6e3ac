// register_ops: one torch::Library per (backend key, op), created at run time so that the set of
// intercepted ops comes from the configuration rather than from static initialisers.
#include "dispatcher/registry.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <mutex>

#include "dispatcher/composite.h"
#include "dispatcher/intercept.h"
#include "dispatcher/state.h"
#include "runtime/fork.h"
#include "runtime/log.h"

namespace kc::dispatch {
namespace {

// Per op, the schema's argument names; written once under register_ops' lock before the op's first
// kernel is installed, read-only afterwards (the hot path reads them without a lock).
struct ArgNames {
  std::vector<std::string> names;
  std::vector<const char*> ptrs;
};
std::array<ArgNames, kNumOps>& arg_table() {
  static std::array<ArgNames, kNumOps> t;
  return t;
}

bool is_tensor_arg(const c10::Argument& arg) {
  c10::TypePtr t = arg.real_type();
  if (t->kind() == c10::TypeKind::OptionalType) t = t->castRaw<c10::OptionalType>()->getElementType();
  return t->kind() == c10::TypeKind::TensorType;
}

}  // namespace

const char* const* arg_names(OpId op) { return arg_table()[static_cast<int>(op)].ptrs.data(); }

bool set_arg_names(OpId op, size_t arity) {
  const OpInfo& o = op_info(op);
  ArgNames& a = arg_table()[static_cast<int>(op)];
  if (a.ptrs.empty()) {
    auto h = c10::Dispatcher::singleton().findSchema({o.aten, o.overload});
    if (!h) {
      log(LogLevel::kWarn, std::string("could not intercept ") + o.name + ": no operator " + o.aten);
      return false;
    }
    size_t tensors = 0, scalars = 0;
    for (const auto& arg : h->schema().arguments()) {
      a.names.push_back(arg.name());
      ++(is_tensor_arg(arg) ? tensors : scalars);
    }
    if (tensors > Call::kMaxTensors || scalars > Call::kMaxScalars) {
      log(LogLevel::kWarn, std::string("could not intercept ") + o.name + ": " + std::to_string(tensors) +
                               " tensor and " + std::to_string(scalars) + " scalar arguments, more than a call binds");
      a.names.clear();
      return false;
    }
    for (const auto& n : a.names) a.ptrs.push_back(n.c_str());
  }
  if (a.ptrs.size() != arity) {
    log(LogLevel::kWarn, std::string("could not intercept ") + o.name + ": its schema has " +
                             std::to_string(a.ptrs.size()) + " arguments, the kernel " + std::to_string(arity));
    return false;
  }
  return true;
}

void register_ops(const std::vector<std::string>& ops) {
  static constinit PerFork<std::mutex> mu;   // one per process: runtime/fork.h
  std::lock_guard<std::mutex> g(mu.get());
  State& st = State::get();
  for (const auto& name : ops) {
    auto id = op_by_name(name);
    if (!id || st.registered(*id)) continue;
    try {
      if (op_info(*id).composite) {
        if (register_composite(*id)) st.set_registered(*id);
        continue;
      }
      // Leaked on purpose: destroying a Library deregisters, which must not happen at exit while
      // the interpreter may still run ops.
      auto* cpu = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
      bool ok = register_cpu(*cpu, *id);
#ifdef KC_WITH_CUDA
      auto* cuda = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA, __FILE__, __LINE__);
      ok = register_cuda(*cuda, *id) && ok;
#endif
      if (ok) st.set_registered(*id);
    } catch (const std::exception& e) {
      log(LogLevel::kWarn, std::string("could not intercept ") + name + ": " + e.what());
    }
  }
}

}  // namespace kc::dispatch
