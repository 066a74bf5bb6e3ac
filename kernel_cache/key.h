// Cache keys: the exact thing a kernel was verified for, as a canonical string (schema below).
// This format is a compatibility contract: change it only by bumping kKeyVersion.
//
//   kc<version>|<target>|<op>|<policy>|<arg>|<arg>...
//   target: the backend's target_id(), e.g. "cpu-x86_64+gcc-12.2.0" or "cuda-sm_90+drv-13000+nvrtc-13.0"
//   op:     the aten operator, e.g. "aten::native_layer_norm"
//   policy: precision policy, "fp32" (default), "tf32" or "bf16"
//   arg (schema order, tensor or scalar):
//     <name>=T:<dtype>[<sizes>]s[<strides>]a<align>   e.g. self=T:f32[64,256]s[256,1]a16
//     <name>=none                                      an absent optional tensor
//     <name>=i:<int> | d:<double %.17g> | b:0/1 | s:<string> | L:[<ints>]
//     <name>=s:none                                    an absent optional scalar or int list
#pragma once
#include <string>

#include "runtime/backend.h"
#include "runtime/status.h"

#include "runtime/tensor_meta.h"

namespace kc {

constexpr int kKeyVersion = 1;
// Every record key starts with this; the store also holds other entries (the worker's
// "search|<key>" states), so listings scan this prefix.
constexpr const char* kRecordKeyPrefix = "kc";

// Builds the canonical key of one call. Appends only; cheap enough for the hot path.
class KeyBuilder {
 public:
  KeyBuilder(const std::string& target, const char* op, const char* policy);
  void tensor(const char* name, DType dt, const int64_t* sizes, const int64_t* strides, size_t ndim,
              int align);
  void tensor(const char* name, const TensorMeta& t);
  void absent(const char* name);
  void i(const char* name, int64_t v);
  void d(const char* name, double v);
  void b(const char* name, bool v);
  void s(const char* name, const std::string& v);
  void list(const char* name, const int64_t* v, size_t n);
  const std::string& str() const { return key_; }
  std::string take() { return std::move(key_); }

 private:
  void head(const char* name, const char* kind);
  std::string key_;
};

// The op field of a key ("aten::relu"), or "" if the key does not parse.
std::string key_op(const std::string& key);
// The target field of a key, or "".
std::string key_target(const std::string& key);
// The cache entry of a key's search state ("search|<key>"): the worker's resumable history of the
// search, which a job's coordinator also hands to the node that takes a key over.
std::string search_state_key(const std::string& key);

// What a target field names: "cpu-<isa>+<compiler>..." or "cuda-sm_<XX>+...". The one parser of
// targets; anything else is kInvalid (never read as some default backend).
struct TargetInfo {
  BackendKind kind = BackendKind::kCpu;
  int sm = 0;   // kCuda: the architecture, e.g. 90
};
Result<TargetInfo> parse_target(const std::string& target);

}  // namespace kc
