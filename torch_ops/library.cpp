// libkernelcraft.so's entry: torch.ops.kernelcraft.* (control and introspection) and, at load,
// registration of the interception kernels for the configured ops.
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <stdlib.h>

#include <cstdlib>

#include "dispatcher/coordinator.h"
#include "dispatcher/evolution.h"
#include "dispatcher/shadow.h"
#include "dispatcher/state.h"

#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/fsutil.h"
#include "runtime/log.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"
#include "runtime/worker_client.h"

namespace kc {
namespace {

using dispatch::State;

std::vector<OpId> resolve_ops(const std::vector<std::string>& names) {
  std::vector<OpId> ids;
  for (const auto& n : names) {
    auto id = op_by_name(n);
    TORCH_CHECK(id.has_value(), "kernelcraft: unknown op '", n, "' (see `kernelcraft ops`)");
    ids.push_back(*id);
  }
  return ids;
}

void set_enabled(const std::vector<std::string>& names, bool on) {
  Config c = State::get().config();
  nlohmann::json j;
  if (names.empty()) {
    j["enabled"] = on;
  } else {
    resolve_ops(names);   // user mistakes raise here, before anything changes
    std::vector<std::string> ops = c.ops;
    for (const auto& n : names) {
      std::string canon = op_info(*op_by_name(n)).name;
      auto it = std::find(ops.begin(), ops.end(), canon);
      if (on && it == ops.end()) ops.push_back(canon);
      if (!on && it != ops.end()) ops.erase(it);
    }
    j["ops"] = ops;
    if (on) j["enabled"] = true;
  }
  Status s = State::get().configure(j);
  TORCH_CHECK(s.is_ok(), "kernelcraft: ", s.to_string());
}

void op_enable(std::optional<std::vector<std::string>> ops) { set_enabled(ops.value_or(std::vector<std::string>{}), true); }
void op_disable(std::optional<std::vector<std::string>> ops) { set_enabled(ops.value_or(std::vector<std::string>{}), false); }
std::string op_status() { return State::get().status_json().dump(); }
void op_reset_counters() { State::get().reset_counters(); }

void op_configure(std::string json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  TORCH_CHECK(!j.is_discarded(), "kernelcraft.configure: not valid JSON");
  Status s = State::get().configure(j);
  TORCH_CHECK(s.is_ok(), "kernelcraft.configure: ", s.to_string());
}

std::vector<std::string> op_missed_keys() { return State::get().missed_keys(); }

std::string op_config() { return to_json(State::get().config()).dump(); }

// put_kernel(verify=True): `kernelcraft cache put --verify` in a child process, so the gauntlet
// (and the kernel it runs) never touches this process; the caller waits for it.
std::string put_verified(const std::string& key, const std::string& source, const std::string& launch_json) {
  Config c = State::get().config();
  TORCH_CHECK(!c.cache_readonly, "kernelcraft.put_kernel: the cache is configured read-only");
  const std::string exe = c.worker.empty() ? default_worker_exe() : c.worker;
  TORCH_CHECK(!exe.empty(), "kernelcraft.put_kernel: cannot find the kernelcraft executable (set KERNELCRAFT_WORKER)");
  ScopedTempDir tmp("put");   // removed on every way out of here, the TORCH_CHECKs included
  TORCH_CHECK(tmp.ok(), "kernelcraft.put_kernel: cannot create a temporary directory");
  const std::string& dir = tmp.path();
  const std::string src = dir + "/kernel.src", spec = dir + "/launch.json", out = dir + "/output.txt";
  std::string reason;
  Result<ProcessResult> r = Status::error(Code::kIOError, "cannot write the kernel to " + dir);
  if (write_file(src, source) && write_file(spec, launch_json)) {
    ProcessOptions po;
    po.timeout_s = c.evolve_candidate_timeout_s + 120;
    po.output_path = out;
    r = run_process({exe, "--cache-dir", State::get().table().dir(), "cache", "put", "--verify", "--key", key,
                     "--source", src, "--launch", spec},
                    po);
    // The command's one-line reason on failure: its last "kernelcraft: " line.
    std::string text = read_file(out), line;
    for (size_t at = 0; at < text.size();) {
      size_t nl = text.find('\n', at);
      line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
      if (line.rfind("kernelcraft: ", 0) == 0) reason = line.substr(13);
      at = nl == std::string::npos ? text.size() : nl + 1;
    }
  }
  TORCH_CHECK(r.is_ok(), "kernelcraft.put_kernel: could not run ", exe, ": ", r.status().to_string());
  TORCH_CHECK(r.value().ok(), "kernelcraft.put_kernel: ", reason.empty() ? "verification failed" : reason);
  State::get().table().forget(key);
  auto store = Store::open(State::get().table().dir(), Store::Mode::kReadOnly);
  TORCH_CHECK(store.is_ok(), "kernelcraft.put_kernel: stored, but cannot read it back: ", store.status().to_string());
  auto bytes = store.value()->get(key);
  TORCH_CHECK(bytes.is_ok(), "kernelcraft.put_kernel: stored, but cannot read it back: ", bytes.status().to_string());
  auto rec = decode_record(bytes.value());
  TORCH_CHECK(rec.is_ok(), "kernelcraft.put_kernel: ", rec.status().to_string());
  return record_summary(rec.value()).dump();
}

std::string op_put_kernel(std::string key, std::string source, std::string launch_json, bool verify) {
  nlohmann::json launch = nlohmann::json::parse(launch_json, nullptr, false);
  TORCH_CHECK(!launch.is_discarded(), "kernelcraft.put_kernel: launch spec is not valid JSON");
  if (verify) return put_verified(key, source, launch_json);
  auto rec = make_manual_record(key, source, launch, "torch.ops.kernelcraft.put_kernel");
  TORCH_CHECK(rec.is_ok(), "kernelcraft.put_kernel: ", rec.status().to_string());
  Config c = State::get().config();
  TORCH_CHECK(!c.cache_readonly, "kernelcraft.put_kernel: the cache is configured read-only");
  Status s = put_record(State::get().table().dir(), rec.value());
  TORCH_CHECK(s.is_ok(), "kernelcraft.put_kernel: ", s.to_string());
  State::get().table().forget(key);
  return record_summary(rec.value()).dump();
}

void op_forget() { State::get().table().forget_all(); }

// Blocks the caller (never the dispatcher) until this process's evolution jobs have ended.
bool op_wait_for_evolution(double timeout_s) { return dispatch::wait_for_evolution(timeout_s); }
std::string op_evolution_status() { return dispatch::evolution_status().dump(); }

bool already_loaded() {
  return c10::Dispatcher::singleton().findSchema({"kernelcraft::status", ""}).has_value();
}

struct Init {
  Init() {
    try {
      if (already_loaded()) {
        log(LogLevel::kWarn, "another copy of libkernelcraft is already loaded; this one stays inactive");
        return;
      }
      // Leaked: the library stays registered for the life of the process.
      auto* lib = new torch::Library(torch::Library::DEF, "kernelcraft", std::nullopt, __FILE__, __LINE__);
      lib->def("enable(str[]? ops=None) -> ()", &op_enable);
      lib->def("disable(str[]? ops=None) -> ()", &op_disable);
      lib->def("status() -> str", &op_status);
      lib->def("reset_counters() -> ()", &op_reset_counters);
      lib->def("configure(str json) -> ()", &op_configure);
      lib->def("config() -> str", &op_config);
      lib->def("missed_keys() -> str[]", &op_missed_keys);
      lib->def("put_kernel(str key, str source, str launch, bool verify=False) -> str", &op_put_kernel);
      lib->def("forget() -> ()", &op_forget);
      lib->def("wait_for_evolution(float timeout_s=600.0) -> bool", &op_wait_for_evolution);
      lib->def("evolution_status() -> str", &op_evolution_status);
      dispatch::register_ops(State::get().config().ops);
      // The hook stops the store thread, so it must run before RocksDB's statics are destroyed,
      // that is, be registered after they are constructed. Its namespace-scope statics are (it is
      // loaded before us); its default Env is a function-local static that the first open would
      // build after the hook, so it is built here first. Without that, a catch-up at exit called
      // into the destroyed Env (SIGSEGV, jump to address 0); without the hook at all, processes
      // serving kernels crashed at exit the same way.
      construct_rocksdb_singletons();
      // Disables the live check found are written first (for at most 5 s): they are what keeps
      // every other process from serving a kernel this one caught.
      std::atexit([] {
        dispatch::flush_disables(5.0);
        dispatch::stop_coordination(1.0);
        State::get().shut_down();
      });
    } catch (const std::exception& e) {
      log(LogLevel::kError, std::string("initialisation failed, nothing is intercepted: ") + e.what());
    }
  }
};
Init init_;

}  // namespace
}  // namespace kc
