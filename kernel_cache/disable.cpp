// disabled_copy / disable_stored / same_kernel: see disable.h.
#include "kernel_cache/disable.h"

#include "kernel_cache/store.h"

namespace kc {

Record disabled_copy(const Record& r, const nlohmann::json& evidence) {
  Record d = r;
  d.state = RecordState::kDisabled;
  d.meta["disabled"] = evidence.is_object() ? evidence : nlohmann::json{{"why", evidence}};
  return d;
}

bool same_kernel(const Record& a, const Record& b) {
  return a.source == b.source && a.launch == b.launch && a.blob == b.blob;
}

Status disable_stored(const std::string& dir, const Record& checked, const nlohmann::json& evidence,
                      int lock_wait_ms) {
  auto store = Store::open(dir, Store::Mode::kWriter, lock_wait_ms);
  if (!store) return store.status();
  auto bytes = store.value()->get(checked.key);
  if (!bytes) return bytes.status();
  auto now = decode_record(bytes.value());
  if (!now) return now.status();
  if (!same_kernel(now.value(), checked) || (now->state != RecordState::kServed && now->state != RecordState::kDisabled))
    return Status::error(Code::kNotFound, "the record for this key was replaced meanwhile; left as it is");
  if (now->state == RecordState::kDisabled) return Status::ok();
  return store.value()->put(checked.key, encode_record(disabled_copy(now.value(), evidence)));
}

}  // namespace kc
