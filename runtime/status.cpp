// Names for status codes, used in log lines and the CLI's --json output.
#include "runtime/status.h"

namespace kc {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kNotFound: return "not_found";
    case Code::kInvalid: return "invalid";
    case Code::kUnsupported: return "unsupported";
    case Code::kUnavailable: return "unavailable";
    case Code::kCompileError: return "compile_error";
    case Code::kLaunchError: return "launch_error";
    case Code::kCorrupt: return "corrupt";
    case Code::kIOError: return "io_error";
    case Code::kBusy: return "busy";
    case Code::kTimeout: return "timeout";
    case Code::kRejected: return "rejected";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(code_name(code_)) + ": " + msg_;
}

}  // namespace kc
