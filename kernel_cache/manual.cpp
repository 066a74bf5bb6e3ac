// make_manual_record / put_record.
#include "kernel_cache/manual.h"

#include <ctime>

#include "kernel_cache/key.h"
#include "kernel_cache/live_compare.h"
#include "kernel_cache/store.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"

namespace kc {

Result<CompileOutput> compile_for_target(const std::string& target, const std::string& source, BackendKind* backend) {
  auto t = parse_target(target);
  if (!t) return t.status();
  if (backend) *backend = t->kind;
  if (t->kind == BackendKind::kCuda) return nvrtc_compile(source, t->sm);
  if (target != cpu_backend().target_id())
    return Status::error(Code::kInvalid, "key is for CPU target " + target + " but this machine is " +
                                             cpu_backend().target_id());
  return cpu_backend().compile(source);
}

Result<Record> make_manual_record(const std::string& key, const std::string& source,
                                  const nlohmann::json& launch, const std::string& by) {
  std::string op = key_op(key), target = key_target(key);
  if (op.empty() || target.empty()) return Status::error(Code::kInvalid, "not a kernelcraft key: " + key);
  auto spec = parse_launch_spec(launch);
  if (!spec) return spec.status();
  Record r;
  r.key = key;
  r.op = op;
  r.source = source;
  r.launch = to_json(spec.value());
  auto out = compile_for_target(target, source, &r.backend);
  if (!out) return out.status();
  r.blob = std::move(out->binary);
  r.meta["compile"] = {{"log", out->log}, {"ms", out->millis}};
  r.meta["provenance"] = {{"by", by}, {"verified", false}, {"created", static_cast<int64_t>(std::time(nullptr))}};
  return r;
}

Result<Record> record_of_binary(const std::string& key, const std::string& source, const nlohmann::json& launch,
                                std::string binary) {
  auto target = parse_target(key_target(key));
  if (!target) return target.status();
  if (binary.empty()) return Status::error(Code::kInvalid, "an empty binary");
  auto spec = parse_launch_spec(launch);
  if (!spec) return spec.status();
  Record r;
  r.key = key;
  r.op = key_op(key);
  r.source = source;
  r.launch = to_json(spec.value());
  r.backend = target->kind;
  r.blob = std::move(binary);
  return r;
}

Status put_record(const std::string& dir, const Record& r, int lock_wait_ms) {
  {
    auto store = Store::open(dir, Store::Mode::kWriter, lock_wait_ms);
    if (!store) return store.status();
    KC_RETURN_IF_ERROR(store.value()->put(r.key, encode_record(r)));
  }
  ensure_live_compare_for(dir, r);   // a CUDA record is live-checked where it is served
  return Status::ok();
}

}  // namespace kc
