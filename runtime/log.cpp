// Logging: a threshold read once from the environment, a mutex so lines never interleave (one per
// process: runtime/fork.h), and the tags already logged once.
#include "runtime/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "runtime/fork.h"

namespace kc {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("KERNELCRAFT_LOG_LEVEL");
  if (!v) return LogLevel::kWarn;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(v, "info")) return LogLevel::kInfo;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  if (!std::strcmp(v, "off")) return LogLevel::kOff;
  return LogLevel::kWarn;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> l{static_cast<int>(level_from_env())};
  return l;
}

// A fork()ed child starts with no tags seen: it is a process of its own, and reading the parent's
// set could find it half-updated by a thread that does not exist in the child.
struct LogState {
  std::mutex line_mu;   // one line at a time
  std::mutex seen_mu;   // guards seen
  std::set<std::string> seen;
};

constinit PerFork<LogState> g_state;

const char* name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warning";
    case LogLevel::kError: return "error";
    default: return "";
  }
}

}  // namespace

void set_log_level(LogLevel l) { level_ref().store(static_cast<int>(l)); }
LogLevel log_level() { return static_cast<LogLevel>(level_ref().load()); }

void log(LogLevel l, const std::string& msg) {
  if (static_cast<int>(l) < level_ref().load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> g(g_state.get().line_mu);
  std::fprintf(stderr, "[kernelcraft] %s: %s\n", name(l), msg.c_str());
  std::fflush(stderr);
}

void log_once(LogLevel l, const std::string& tag, const std::string& msg) {
  LogState& st = g_state.get();
  {
    std::lock_guard<std::mutex> g(st.seen_mu);
    if (!st.seen.insert(tag).second) return;
  }
  log(l, msg);
}

}  // namespace kc
