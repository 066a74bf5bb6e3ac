// Bundle export and import (format in bundle.h): whole-file CBOR, written atomically, every entry
// validated with decode_record so a bad bundle can never put an unparseable record in a cache.
#include "kernel_cache/bundle.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <nlohmann/json.hpp>

#include "kernel_cache/key.h"
#include "kernel_cache/record.h"
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

Result<ExportStats> export_impl(Store& store, const std::string& path, const BundleFilter& filter) {
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
    records.push_back({{"key", key}, {"value", to_binary(value)}});
    ++st.exported;
    return true;
  }, &st.damaged);
  KC_RETURN_IF_ERROR(scan);
  json bundle = {{"magic", kMagic},
                 {"version", kBundleVersion},
                 {"created", static_cast<int64_t>(std::time(nullptr))},
                 {"count", st.exported},
                 {"records", std::move(records)}};
  std::string bytes;
  json::to_cbor(bundle, bytes);
  st.bytes = bytes.size();
  KC_RETURN_IF_ERROR(write_file_atomic(path, bytes));
  return st;
}

Result<json> parse_bundle(const std::string& path) {
  auto bytes = read_file(path);
  if (!bytes) return bytes.status();
  auto parsed = parse_cbor(bytes.value());
  if (!parsed || !parsed.value().is_object())
    return Status::error(Code::kCorrupt, path + " is not a kernelcraft bundle (not CBOR)");
  json b = std::move(parsed.value());
  auto magic = b.find("magic");
  if (magic == b.end() || !magic->is_string() || magic->get<std::string>() != kMagic)
    return Status::error(Code::kCorrupt, path + " is not a kernelcraft bundle (no magic)");
  auto version = b.find("version");
  if (version == b.end() || !version->is_number_integer())
    return Status::error(Code::kCorrupt, path + ": bundle has no version");
  if (version->get<int64_t>() != kBundleVersion)
    return Status::error(Code::kUnsupported, path + ": bundle version " +
                                                 std::to_string(version->get<int64_t>()) +
                                                 " (this build reads version " +
                                                 std::to_string(kBundleVersion) + ")");
  auto records = b.find("records");
  if (records == b.end() || !records->is_array())
    return Status::error(Code::kCorrupt, path + ": bundle has no record list");
  return b;
}

Result<ImportStats> import_impl(Store& store, const std::string& path, const ImportOptions& opts) {
  if (!opts.dry_run && store.mode() != Store::Mode::kWriter)
    return Status::error(Code::kInvalid, "import needs the cache opened for writing");
  auto bundle = parse_bundle(path);
  if (!bundle) return bundle.status();
  ImportStats st;
  size_t index = 0;
  for (const json& e : bundle.value()["records"]) {
    std::string label = "entry " + std::to_string(index++);
    auto reject = [&](const std::string& why) {
      ++st.rejected;
      st.errors.push_back(label + ": " + why);
    };
    if (!e.is_object()) { reject("not a map"); continue; }
    auto k = e.find("key");
    auto v = e.find("value");
    if (k == e.end() || !k->is_string()) { reject("no key"); continue; }
    label = k->get<std::string>();
    if (v == e.end() || !v->is_binary()) { reject("no value bytes"); continue; }
    const auto& bin = v->get_binary();
    std::string value(reinterpret_cast<const char*>(bin.data()), bin.size());
    auto rec = decode_record(value);
    if (!rec) { reject(rec.status().to_string()); continue; }
    // A record answers exactly for the key it was verified for; storing it under another would
    // serve it for calls it was never checked against.
    if (rec->key != label) { reject("record was made for a different key: " + rec->key); continue; }
    auto old = store.get(label);
    if (old && old.value() == value) { ++st.unchanged; continue; }
    if (old && !opts.overwrite) { ++st.kept; continue; }
    if (!old && old.status().code() != Code::kNotFound) return old.status();
    if (!opts.dry_run) KC_RETURN_IF_ERROR(store.put(label, value));
    ++st.imported;
  }
  return st;
}

}  // namespace

Result<ExportStats> export_bundle(Store& store, const std::string& path, const BundleFilter& filter) {
  try {
    return export_impl(store, path, filter);
  } catch (const std::exception& e) {
    return Status::error(Code::kIOError, "export to " + path + ": " + e.what());
  }
}

Result<ImportStats> import_bundle(Store& store, const std::string& path, const ImportOptions& opts) {
  try {
    return import_impl(store, path, opts);
  } catch (const std::exception& e) {
    return Status::error(Code::kCorrupt, "import from " + path + ": " + e.what());
  }
}

}  // namespace kc
