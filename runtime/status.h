// Status: the typed result every fallible call in kernelcraft returns instead of throwing.
#pragma once
#include <string>
#include <utility>

namespace kc {

enum class Code {
  kOk = 0,
  kNotFound,        // nothing stored / nothing to serve: the caller falls back
  kInvalid,         // malformed input (spec, record, key, config)
  kUnsupported,     // this backend / argument combination is not handled
  kUnavailable,     // a dependency is absent (no driver, no NVRTC, cache locked)
  kCompileError,    // host compiler or NVRTC rejected the source
  kLaunchError,     // a kernel launch or load failed
  kCorrupt,         // stored data failed to parse or verify
  kIOError,         // filesystem / database error
  kBusy,            // another process holds what we need; try again later
  kTimeout,
  kRejected,        // verification said no
};

const char* code_name(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(Code c, std::string msg) { return Status(c, std::move(msg)); }
  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string to_string() const;
  // Marks a deliberate swallow so it can be found with grep.
  void ignore() const {}

 private:
  Status(Code c, std::string m) : code_(c), msg_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string msg_;
};

// A value or the Status saying why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T v) : value_(std::move(v)), has_(true) {}          // NOLINT: implicit by design
  Result(Status s) : status_(std::move(s)), has_(false) {}    // NOLINT
  bool is_ok() const { return has_; }
  explicit operator bool() const { return has_; }
  const Status& status() const { return status_; }
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }

 private:
  T value_{};
  Status status_;
  bool has_;
};

#define KC_RETURN_IF_ERROR(expr)            \
  do {                                      \
    ::kc::Status _kc_s = (expr);            \
    if (!_kc_s.is_ok()) return _kc_s;       \
  } while (0)

}  // namespace kc
