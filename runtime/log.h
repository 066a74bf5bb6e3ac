// One-line logging to stderr with a level threshold (KERNELCRAFT_LOG_LEVEL) and warn-once.
#pragma once
#include <string>

namespace kc {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel l);
LogLevel log_level();
// Writes "[kernelcraft] <level>: <msg>\n" to stderr if l passes the threshold.
void log(LogLevel l, const std::string& msg);
// Logs only the first time `tag` is seen in this process; later calls are silent.
void log_once(LogLevel l, const std::string& tag, const std::string& msg);

}  // namespace kc
