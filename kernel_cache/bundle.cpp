// Bundle export and import (format and trust in bundle.h): whole-file CBOR, written atomically;
// every entry validated with decode_record, rebuilt here and compared by hash before it is stored.
#include "kernel_cache/bundle.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <nlohmann/json.hpp>

#include "kernel_cache/bundle_trust.h"
#include "kernel_cache/key.h"
#include "kernel_cache/live_compare.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "runtime/binary_check.h"
#include "runtime/json_util.h"
#include "runtime/ops.h"

namespace kc {
namespace {

using nlohmann::json;

const char* kMagic = "kernelcraft-bundle";

Status errno_status(const std::string& what) {
  return Status::error(Code::kIOError, what + ": " + std::strerror(errno));
}

// Write to a sibling temporary file, fsync, rename: readers of `path` see the old file or the
// whole new one, never a torn bundle.
Status write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp-" + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("cannot create " + tmp);
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = errno_status("cannot write " + tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    Status s = errno_status("cannot flush " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = errno_status("cannot rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return s;
  }
  return Status::ok();
}

Result<std::string> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::error(Code::kNotFound, "no such file: " + path);
    return errno_status("cannot open " + path);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = errno_status("cannot read " + path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// The aten name a filter's op refers to; unknown names are compared as given.
std::string filter_op(const std::string& op) {
  if (op.empty()) return op;
  auto id = op_by_name(op);
  return id ? op_info(*id).aten : op;
}

json::binary_t to_binary(const std::string& s) {
  return json::binary_t(json::binary_t::container_type(s.begin(), s.end()));
}

// A bundle entry: the record without its binary, which stays behind; the importer builds its
// own and compares hashes.
json entry_of(const std::string& key, Record rec) {
  json binary = nullptr;
  if (!rec.blob.empty()) binary = {{"bytes", rec.blob.size()}, {"blake2b", binary_hash(rec.blob)}};
  rec.blob.clear();
  return {{"key", key}, {"record", to_binary(encode_record(rec))}, {"binary", binary}};
}

Result<std::string> bundle_of_entries(json records, const std::string& secret_key) {
  const size_t count = records.size();
  json payload = {{"created", static_cast<int64_t>(std::time(nullptr))}, {"count", count},
                  {"records", std::move(records)}};
  std::string payload_bytes;
  json::to_cbor(payload, payload_bytes);
  json bundle = {{"magic", kMagic}, {"version", kBundleVersion}, {"payload", to_binary(payload_bytes)}};
  if (!secret_key.empty()) {
    std::string sig = sign_payload(payload_bytes, secret_key);
    if (sig.empty()) return Status::error(Code::kInvalid, "cannot sign: not an ed25519 secret key");
    bundle["signature"] = {{"alg", "ed25519"}, {"public_key", to_binary(secret_key.substr(32))}, {"sig", to_binary(sig)}};
  }
  std::string bytes;
  json::to_cbor(bundle, bytes);
  return bytes;
}

Result<ExportStats> export_impl(Store& store, const std::string& path, const BundleFilter& filter,
                                const std::string& secret_key) {
  ExportStats st;
  std::string op = filter_op(filter.op);
  json records = json::array();
  Status scan = store.scan(kRecordKeyPrefix, [&](const std::string& key, const std::string& value) {
    if (!filter.key_contains.empty() && key.find(filter.key_contains) == std::string::npos) return true;
    auto rec = decode_record(value);
    if (!rec) {
      ++st.skipped;
      st.errors.push_back(key + ": " + rec.status().to_string());
      return true;
    }
    if (!op.empty() && key_op(key) != op && rec->op != op) return true;
    records.push_back(entry_of(key, std::move(rec.value())));
    ++st.exported;
    return true;
  }, &st.damaged);
  KC_RETURN_IF_ERROR(scan);
  auto bytes = bundle_of_entries(std::move(records), secret_key);
  if (!bytes) return bytes.status();
  st.bytes = bytes->size();
  KC_RETURN_IF_ERROR(write_file_atomic(path, bytes.value()));
  return st;
}

std::string bytes_of(const json& j) {
  const auto& b = j.get_binary();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// A bundle's entries, whatever its version, and the bytes a signature would cover.
struct Parsed {
  int version = 0;
  json records;           // array
  std::string payload;    // version 2 only
  json signature;         // null when absent
};

// `path` names the bundle in messages (a file, or where the bytes came from).
Result<Parsed> parse_bundle(const std::string& bytes, const std::string& path) {
  auto parsed = parse_cbor(bytes);
  if (!parsed || !parsed.value().is_object())
    return Status::error(Code::kCorrupt, path + " is not a kernelcraft bundle (not CBOR)");
  json b = std::move(parsed.value());
  auto magic = b.find("magic");
  if (magic == b.end() || !magic->is_string() || magic->get<std::string>() != kMagic)
    return Status::error(Code::kCorrupt, path + " is not a kernelcraft bundle (no magic)");
  auto version = b.find("version");
  if (version == b.end() || !version->is_number_integer())
    return Status::error(Code::kCorrupt, path + ": bundle has no version");
  const int64_t v = version->get<int64_t>();
  if (v != 1 && v != kBundleVersion)
    return Status::error(Code::kUnsupported, path + ": bundle version " + std::to_string(v) + " (this build reads 1 and " +
                                                 std::to_string(kBundleVersion) + ")");
  Parsed out;
  out.version = static_cast<int>(v);
  json body = b;
  if (v == kBundleVersion) {
    auto p = b.find("payload");
    if (p == b.end() || !p->is_binary()) return Status::error(Code::kCorrupt, path + ": bundle has no payload");
    out.payload = bytes_of(*p);
    auto inner = parse_cbor(out.payload);
    if (!inner || !inner.value().is_object()) return Status::error(Code::kCorrupt, path + ": payload is not CBOR");
    body = std::move(inner.value());
    if (auto s = b.find("signature"); s != b.end()) out.signature = *s;
  }
  auto records = body.find("records");
  if (records == body.end() || !records->is_array())
    return Status::error(Code::kCorrupt, path + ": bundle has no record list");
  out.records = std::move(*records);
  return out;
}

// The hex key of the trusted signer, "" when none is trusted; kRejected when the signature is bad,
// or when trusted keys are required and the bundle is unsigned or signed by another key.
Result<std::string> check_signature(const Parsed& p, const std::vector<std::string>& trusted) {
  if (p.signature.is_null()) {
    if (trusted.empty()) return std::string();
    return Status::error(Code::kRejected, "the bundle is not signed, and trusted keys are required");
  }
  const json& s = p.signature;
  if (!s.is_object() || s.value("alg", "") != "ed25519" || !s.contains("public_key") || !s["public_key"].is_binary() ||
      !s.contains("sig") || !s["sig"].is_binary())
    return Status::error(Code::kRejected, "the bundle's signature block is malformed");
  const std::string pk = bytes_of(s["public_key"]), sig = bytes_of(s["sig"]);
  if (!signature_valid(p.payload, sig, pk))
    return Status::error(Code::kRejected, "the bundle's signature does not verify (changed after signing?)");
  if (trusted.empty()) return std::string();   // a good signature by a key nobody said to trust
  for (const auto& k : trusted)
    if (k == pk) return to_hex(pk);
  return Status::error(Code::kRejected, "the bundle is signed by " + to_hex(pk) + ", which is not a trusted key");
}

// One entry as (label, record without blob, exporter's hash or "" for no binary), or why not.
struct Entry {
  std::string label;
  Record rec;
  std::string hash;
};

Result<Entry> read_entry(const json& e, int version, std::string& label) {
  if (!e.is_object()) return Status::error(Code::kCorrupt, "not a map");
  auto k = e.find("key");
  if (k == e.end() || !k->is_string()) return Status::error(Code::kCorrupt, "no key");
  label = k->get<std::string>();
  auto v = e.find(version == 1 ? "value" : "record");
  if (v == e.end() || !v->is_binary()) return Status::error(Code::kCorrupt, "no record bytes");
  auto rec = decode_record(bytes_of(*v));
  if (!rec) return rec.status();
  Entry out{label, std::move(rec.value()), ""};
  if (version == 1) {   // the carried binary is only ever used for its hash
    if (!out.rec.blob.empty()) out.hash = binary_hash(out.rec.blob);
    out.rec.blob.clear();
    return out;
  }
  if (!out.rec.blob.empty()) return Status::error(Code::kCorrupt, "carries a binary (version 2 carries hashes only)");
  auto b = e.find("binary");
  if (b != e.end() && !b->is_null()) {
    if (!b->is_object() || !b->contains("blake2b") || !(*b)["blake2b"].is_string())
      return Status::error(Code::kCorrupt, "malformed binary hash");
    out.hash = (*b)["blake2b"].get<std::string>();
  }
  return out;
}

// The default rebuild: this machine's compiler for the key's target; a CPU build must also pass
// the binary check, since it is what this cache will load.
Result<std::string> rebuild_here(const Record& r) {
  BackendKind backend = BackendKind::kCpu;
  auto out = compile_for_target(key_target(r.key), r.source, &backend);
  if (!out) return Status::error(out.status().code(), "cannot rebuild it here: " + out.status().message());
  if (backend == BackendKind::kCpu)
    if (BinaryCheck bc = check_cpu_binary(out->binary); !bc.ok())
      return Status::error(Code::kRejected, "the binary built from its source is refused: " + bc.message());
  return std::move(out->binary);
}

// The record as this machine will store it (its own build as the blob), or why it is refused.
Result<Record> accept(Entry e, const std::string& signer, const ImportOptions& opts, bool& reverified) {
  Record& r = e.rec;
  // A record answers exactly for the key it was verified for; storing it under another would
  // serve it for calls it was never checked against.
  if (r.key != e.label) return Status::error(Code::kRejected, "record was made for a different key: " + r.key);
  const bool reverify = static_cast<bool>(opts.checks.reverify) && r.state == RecordState::kServed;
  const std::string vouched_by = !signer.empty() ? signer : opts.job_peer;
  if (record_verified(r) && vouched_by.empty() && !reverify)
    return Status::error(Code::kRejected, "claims to be verified, but nothing here backs the claim (the bundle is not "
                                          "signed by a trusted key; use --trust, or --reverify)");
  // Kept on someone else's word: the serving path live-checks it on its first calls here
  // (record_verified_here, record.h), whatever shadow_calls says.
  if (record_verified(r) && !reverify) {
    r.meta["provenance"]["verified_here"] = false;
    r.meta["provenance"]["vouched_by"] = vouched_by;
  }
  if (e.hash.empty()) {
    if (r.state == RecordState::kServed) return Status::error(Code::kRejected, "a served record without a binary");
    return r;
  }
  auto built = opts.checks.rebuild ? opts.checks.rebuild(r) : rebuild_here(r);
  if (!built) {
    std::string m = built.status().message();
    return Status::error(Code::kRejected, m.substr(0, m.find('\n')));
  }
  const std::string local = binary_hash(built.value());
  if (!reverify && local != e.hash)
    return Status::error(Code::kRejected, "the binary built here from its source differs from the exporter's (blake2b " +
                                              local.substr(0, 16) + "... vs " + e.hash.substr(0, 16) +
                                              "...): the source is not what the binary was built from, or this "
                                              "machine's compiler differs");
  r.blob = std::move(built.value());
  if (reverify) {
    auto v = opts.checks.reverify(r);
    if (!v) return Status::error(Code::kRejected, "rejected by the gauntlet here: " + v.status().message());
    r.meta["verification"] = v.value();
    r.meta["provenance"]["verified"] = true;
    r.meta["provenance"]["reverified_on_import"] = true;
    reverified = true;
  }
  return r;
}

Result<ImportStats> import_impl(Store& store, const std::string& bytes, const std::string& path,
                                const ImportOptions& opts) {
  if (!opts.dry_run && store.mode() != Store::Mode::kWriter)
    return Status::error(Code::kInvalid, "import needs the cache opened for writing");
  auto bundle = parse_bundle(bytes, path);
  if (!bundle) return bundle.status();
  auto signer = check_signature(bundle.value(), opts.trusted_keys);
  if (!signer) return Status::error(signer.status().code(), path + ": " + signer.status().message());
  ImportStats st;
  st.signed_by = signer.value();
  size_t index = 0;
  for (const json& e : bundle.value().records) {
    std::string label = "entry " + std::to_string(index++);
    auto reject = [&](const Status& why) {
      ++st.rejected;
      st.errors.push_back(label + ": " + why.message());
    };
    auto entry = read_entry(e, bundle.value().version, label);
    if (!entry) { reject(entry.status()); continue; }
    bool reverified = false;
    auto rec = accept(std::move(entry.value()), signer.value(), opts, reverified);
    if (!rec) { reject(rec.status()); continue; }
    const std::string value = encode_record(rec.value());
    auto old = store.get(label);
    if (old && old.value() == value) { ++st.unchanged; continue; }
    if (old && !opts.overwrite) { ++st.kept; continue; }
    if (!old && old.status().code() != Code::kNotFound) return old.status();
    if (!opts.dry_run) {
      KC_RETURN_IF_ERROR(store.put(label, value));
      ensure_live_compare_for(store.dir(), rec.value());
    }
    ++st.imported;
    if (reverified) ++st.reverified;
  }
  return st;
}

}  // namespace

Result<ExportStats> export_bundle(Store& store, const std::string& path, const BundleFilter& filter,
                                  const std::string& secret_key) {
  try {
    return export_impl(store, path, filter, secret_key);
  } catch (const std::exception& e) {
    return Status::error(Code::kIOError, "export to " + path + ": " + e.what());
  }
}

Result<ImportStats> import_bundle(Store& store, const std::string& path, const ImportOptions& opts) {
  auto bytes = read_file(path);
  if (!bytes) return bytes.status();
  return import_bundle_bytes(store, bytes.value(), path, opts);
}

Result<ImportStats> import_bundle_bytes(Store& store, const std::string& bytes, const std::string& from,
                                        const ImportOptions& opts) {
  try {
    return import_impl(store, bytes, from, opts);
  } catch (const std::exception& e) {
    return Status::error(Code::kCorrupt, "import from " + from + ": " + e.what());
  }
}

Result<std::string> bundle_of(const std::vector<Record>& records) {
  try {
    json entries = json::array();
    for (const Record& r : records) entries.push_back(entry_of(r.key, r));
    return bundle_of_entries(std::move(entries), "");
  } catch (const std::exception& e) {
    return Status::error(Code::kInvalid, std::string("cannot encode a bundle: ") + e.what());
  }
}

}  // namespace kc
