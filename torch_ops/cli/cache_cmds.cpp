// `kernelcraft cache ls|show|rm|stats|export|import|repair` and `keygen`: thin wrappers over the
// store and bundles (kernel_cache/bundle.h says what import trusts).
// Reads open the cache read-only (works on shipped, unwritable caches and beside a live writer);
// rm and import open it as the writer, waiting a few seconds for another writer to finish.
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "kernel_cache/bundle.h"
#include "kernel_cache/bundle_trust.h"
#include "kernel_cache/key.h"
#include "kernel_cache/record.h"
#include "kernel_cache/repair.h"
#include "kernel_cache/store.h"
#include "runtime/config.h"
#include "runtime/ops.h"
#include "torch_ops/cli/cli.h"

namespace kc::cli {
namespace {

using nlohmann::json;

constexpr int kLockWaitMs = 10000;

Result<std::unique_ptr<Store>> open_store(const Args& args, Store::Mode mode) {
  return Store::open(args.cache_dir, mode, kLockWaitMs);
}

int store_failure(const Status& s) { return fail(s.message()); }

// One line for the listing commands: what they could not read, and the way out.
void warn_damaged(size_t regions) {
  warn(std::to_string(regions) + " damaged region(s) of the cache could not be read and were skipped; "
       "`kernelcraft cache repair` salvages what is left");
}

// What read commands see where no cache exists yet: nothing. A newcomer's first `cache ls` on a
// fresh machine lists an empty cache and exits 0; only real failures (damage, I/O) exit 1.
class EmptyStore final : public Store {
 public:
  explicit EmptyStore(std::string dir) : dir_(std::move(dir)) {}
  Mode mode() const override { return Mode::kReadOnly; }
  const std::string& dir() const override { return dir_; }
  Result<std::string> get(const std::string& key) override {
    return Status::error(Code::kNotFound, "no kernel cache in " + dir_);
  }
  Status put(const std::string&, const std::string&) override { return read_only(); }
  Status remove(const std::string&) override { return read_only(); }
  Status scan(const std::string&, const std::function<bool(const std::string&, const std::string&)>&,
              size_t*) override {
    return Status::ok();
  }
  Status catch_up() override { return Status::ok(); }
  uint64_t sequence() const override { return 0; }

 private:
  Status read_only() const { return Status::error(Code::kInvalid, "no kernel cache in " + dir_); }
  std::string dir_;
};

// The cache for a read command: a missing one reads as empty (one note on stderr in text mode).
Result<std::unique_ptr<Store>> open_for_read(const Args& args, bool quiet = false) {
  auto st = open_store(args, Store::Mode::kReadOnly);
  if (st || st.status().code() != Code::kNotFound) return st;
  if (!args.json && !quiet) std::fprintf(stderr, "kernelcraft: no kernel cache in %s yet (nothing cached)\n", args.cache_dir.c_str());
  return std::unique_ptr<Store>(new EmptyStore(args.cache_dir));
}

// Exactly `n` operands after "cache <sub>".
int need_operands(const Args& args, size_t n, const char* what) {
  size_t have = args.words.size() - 2;
  if (have < n) return usage_error(std::string("cache ") + args.words[1] + ": missing " + what);
  if (have > n) return usage_error(std::string("cache ") + args.words[1] + ": unexpected operand '" +
                                   args.words[2 + n] + "'");
  return kExitOk;
}

// The aten name --op refers to; "" when --op is absent. Unknown names are a usage error: the op
// table is the list of everything that can ever be in a cache.
Result<std::string> op_filter(const Args& args) {
  std::string op = args.value("op");
  if (op.empty()) return std::string();
  auto id = op_by_name(op);
  if (!id) return Status::error(Code::kInvalid, "unknown op '" + op + "' (kernelcraft ops lists them)");
  return std::string(op_info(*id).aten);
}

int cmd_ls(const Args& args) {
  if (int rc = need_operands(args, 0, ""); rc) return rc;
  auto op = op_filter(args);
  if (!op) return usage_error(op.status().message());
  auto st = open_for_read(args);
  if (!st) return store_failure(st.status());
  std::string match = args.value("match");
  json rows = json::array();
  size_t damaged = 0;
  Status s = st.value()->scan(kRecordKeyPrefix, [&](const std::string& key, const std::string& value) {
    if (!match.empty() && key.find(match) == std::string::npos) return true;
    if (!op.value().empty() && key_op(key) != op.value()) return true;
    auto rec = decode_record(value);
    json row = {{"key", key}, {"op", key_op(key)}};
    if (rec) {
      row.update({{"state", state_name(rec->state)}, {"backend", backend_name(rec->backend)}, {"blob_bytes", rec->blob.size()},
                  {"source_bytes", rec->source.size()}, {"verified", record_verified(rec.value())},
                  {"determinism", determinism_name(rec->determinism)}});
      if (auto d = rec->meta.find("disabled"); d != rec->meta.end() && d->is_object())
        row["disabled_by"] = d->value("by", "");
    } else {
      row.update({{"state", "corrupt"}, {"backend", ""}, {"blob_bytes", 0}, {"verified", false},
                  {"error", rec.status().to_string()}});
    }
    rows.push_back(std::move(row));
    return true;
  }, &damaged);
  if (!s) return store_failure(s);
  if (damaged) warn_damaged(damaged);
  if (args.json) {
    print_json(rows, true);
    return kExitOk;
  }
  // A served record that never passed the gauntlet is not served by default (serve_unverified).
  for (const auto& r : rows) {
    const std::string state = r["state"].get<std::string>();
    const bool unverified = state == "served" && !r["verified"].get<bool>();
    const std::string note = unverified ? "unverified" : r.value("disabled_by", "");
    std::printf("%-10s %-10s %-5s %9zu  %s\n", state.c_str(), note.c_str(), r["backend"].get<std::string>().c_str(),
                r["blob_bytes"].get<size_t>(), r["key"].get<std::string>().c_str());
  }
  return kExitOk;
}

int cmd_show(const Args& args) {
  if (int rc = need_operands(args, 1, "KEY"); rc) return rc;
  const std::string& key = args.words[2];
  auto st = open_for_read(args, /*quiet=*/true);   // its one error line says it all
  if (!st) return store_failure(st.status());
  auto value = st.value()->get(key);
  if (!value) {
    if (value.status().code() == Code::kNotFound) return fail("no record for key " + key);
    return store_failure(value.status());
  }
  auto rec = decode_record(value.value());
  if (!rec) return fail("record for key " + key + " is unreadable: " + rec.status().to_string());
  print_json(record_summary(rec.value()), args.json);
  return kExitOk;
}

int cmd_rm(const Args& args) {
  if (int rc = need_operands(args, 1, "KEY"); rc) return rc;
  const std::string& key = args.words[2];
  // Checked read-only first so a missing key on a missing cache does not create the cache.
  {
    auto ro = open_store(args, Store::Mode::kReadOnly);
    if (!ro) return store_failure(ro.status());
  }
  auto st = open_store(args, Store::Mode::kWriter);
  if (!st) return store_failure(st.status());
  auto old = st.value()->get(key);
  if (!old) {
    if (old.status().code() == Code::kNotFound) return fail("no record for key " + key);
    return store_failure(old.status());
  }
  if (Status s = st.value()->remove(key); !s) return store_failure(s);
  if (args.json) print_json({{"removed", key}}, true);
  else std::printf("removed %s\n", key.c_str());
  return kExitOk;
}

uint64_t dir_bytes(const std::string& dir) {
  std::error_code ec;
  uint64_t total = 0;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fec;
    auto n = it->file_size(fec);
    if (!fec) total += n;
  }
  return total;
}

int cmd_stats(const Args& args) {
  if (int rc = need_operands(args, 0, ""); rc) return rc;
  auto st = open_for_read(args);
  if (!st) return store_failure(st.status());
  size_t records = 0, blob_bytes = 0, value_bytes = 0, damaged = 0;
  std::map<std::string, size_t> by_state, by_backend, by_op;
  Status s = st.value()->scan(kRecordKeyPrefix, [&](const std::string& key, const std::string& value) {
    ++records;
    value_bytes += value.size();
    auto rec = decode_record(value);
    ++by_op[key_op(key).empty() ? "?" : key_op(key)];
    if (!rec) {
      ++by_state["corrupt"];
      return true;
    }
    ++by_state[state_name(rec->state)];
    ++by_backend[backend_name(rec->backend)];
    blob_bytes += rec->blob.size();
    return true;
  }, &damaged);
  if (!s) return store_failure(s);
  if (damaged) warn_damaged(damaged);
  json j = {{"cache_dir", args.cache_dir}, {"records", records},   {"by_state", by_state},
            {"by_backend", by_backend},    {"by_op", by_op},       {"blob_bytes", blob_bytes},
            {"value_bytes", value_bytes},  {"disk_bytes", dir_bytes(args.cache_dir)},
            {"damaged_regions", damaged}};
  if (args.json) {
    print_json(j, true);
    return kExitOk;
  }
  std::printf("cache      %s\nrecords    %zu\nbinaries   %zu bytes\non disk    %llu bytes\n",
              args.cache_dir.c_str(), records, blob_bytes,
              static_cast<unsigned long long>(j["disk_bytes"].get<uint64_t>()));
  for (const auto* group : {"by_state", "by_backend", "by_op"})
    for (const auto& [name, n] : j[group].items())
      std::printf("%-10s %-34s %zu\n", group + 3, name.c_str(), n.get<size_t>());
  return kExitOk;
}

int cmd_export(const Args& args) {
  if (int rc = need_operands(args, 1, "FILE"); rc) return rc;
  const std::string& file = args.words[2];
  auto op = op_filter(args);
  if (!op) return usage_error(op.status().message());
  std::string secret;
  if (!args.value("sign").empty()) {
    auto sk = read_secret_key(args.value("sign"));
    if (!sk) return fail(sk.status().message());
    secret = sk.value();
  }
  auto st = open_for_read(args);
  if (!st) return store_failure(st.status());
  auto ex = export_bundle(*st.value(), file, BundleFilter{args.value("match"), op.value()}, secret);
  if (!ex) return store_failure(ex.status());
  for (const auto& e : ex->errors) warn("skipped unreadable record " + e);
  if (ex->damaged) warn_damaged(ex->damaged);
  const std::string signer = secret.empty() ? "" : to_hex(secret.substr(32));
  if (args.json) {
    print_json({{"file", file}, {"exported", ex->exported}, {"skipped", ex->skipped}, {"damaged_regions", ex->damaged},
                {"bytes", ex->bytes}, {"signed_by", signer}, {"errors", ex->errors}}, true);
  } else {
    std::printf("exported %zu records to %s (%zu bytes%s)\n", ex->exported, file.c_str(), ex->bytes,
                signer.empty() ? ", unsigned" : (", signed by " + signer.substr(0, 16) + "...").c_str());
  }
  return kExitOk;
}

// The keys --trust names (repeatable, each a .pub file or a directory), else trusted_keys from the
// configuration; empty when neither says anything.
Result<std::vector<std::string>> trusted_keys(const Args& args) {
  std::vector<std::string> paths;
  std::string text = args.value("trust");
  char sep = ';';
  if (text.empty()) {
    text = load_config().trusted_keys;
    sep = ',';
  }
  std::stringstream ss(text);
  for (std::string p; std::getline(ss, p, sep);)
    if (!p.empty()) paths.push_back(p);
  if (paths.empty()) return std::vector<std::string>();
  return read_trusted_keys(paths);
}

int cmd_import(const Args& args) {
  if (int rc = need_operands(args, 1, "FILE"); rc) return rc;
  const std::string& file = args.words[2];
  // Validate the file before creating or locking the cache.
  if (!std::filesystem::is_regular_file(file)) return fail("no such bundle file: " + file);
  ImportOptions opts;
  opts.overwrite = !args.flag("no-overwrite");
  auto keys = trusted_keys(args);
  if (!keys) return fail("trusted keys: " + keys.status().message());
  opts.trusted_keys = keys.value();
  if (args.flag("reverify"))
    opts.checks.reverify = [&](const Record& r) { return reverify_for_import(args, r.key, r.source, r.launch); };
  auto st = open_store(args, Store::Mode::kWriter);
  if (!st) return store_failure(st.status());
  auto im = import_bundle(*st.value(), file, opts);
  if (!im) return store_failure(im.status());
  if (args.json) {
    print_json({{"file", file}, {"imported", im->imported}, {"unchanged", im->unchanged}, {"kept", im->kept},
                {"rejected", im->rejected}, {"reverified", im->reverified}, {"signed_by", im->signed_by},
                {"errors", im->errors}}, true);
  } else {
    // One line per refused record, what and why (stderr keeps the one failure line below).
    for (const auto& e : im->errors) std::printf("refused %s\n", e.c_str());
    std::printf("imported %zu records from %s (%zu unchanged, %zu kept, %zu rejected%s%s)\n", im->imported,
                file.c_str(), im->unchanged, im->kept, im->rejected,
                im->reverified ? (", " + std::to_string(im->reverified) + " verified here").c_str() : "",
                im->signed_by.empty() ? "" : (", signed by " + im->signed_by.substr(0, 16) + "...").c_str());
  }
  // The good records are stored; a bundle with bad entries is still a failure scripts should see.
  if (im->rejected)
    return fail(std::to_string(im->rejected) + " bundle entries rejected; first: " + im->errors.front());
  return kExitOk;
}

int cmd_repair(const Args& args) {
  if (int rc = need_operands(args, 0, ""); rc) return rc;
  auto rep = repair_cache(args.cache_dir);
  if (!rep) {
    if (rep.status().code() == Code::kNotFound) return fail("nothing to repair: " + rep.status().message());
    return store_failure(rep.status());
  }
  const RepairReport& r = rep.value();
  if (args.json) {
    print_json({{"cache_dir", args.cache_dir}, {"records", r.records}, {"dropped", r.dropped},
                {"other", r.other}, {"damaged_regions", r.damaged}, {"rocksdb_repair", r.rocksdb_repair},
                {"backup", r.backup_dir}}, true);
  } else {
    std::printf("repaired %s: %zu records kept, %zu unreadable dropped, %zu search states kept\n"
                "the files as they were: %s\n", args.cache_dir.c_str(), r.records, r.dropped, r.other,
                r.backup_dir.c_str());
  }
  return kExitOk;
}

}  // namespace

Result<std::unique_ptr<Store>> open_cache_for_read(const Args& args, bool quiet) { return open_for_read(args, quiet); }

int run_keygen(const Args& args) {
  if (args.words.size() > 1) return usage_error("keygen: unexpected operand '" + args.words[1] + "'");
  const std::string dir = args.value("out");
  if (dir.empty()) return usage_error("keygen needs --out DIR");
  auto kp = generate_key_pair();
  if (!kp) return fail(kp.status().message());
  if (Status s = write_key_pair(dir, "bundle-signing", kp.value()); !s) return fail(s.message());
  const std::string pub = dir + "/bundle-signing.pub", sec = dir + "/bundle-signing.key";
  if (args.json) print_json({{"public_key", pub}, {"secret_key", sec}, {"id", to_hex(kp->public_key)}}, true);
  else std::printf("wrote %s (give it to importers: --trust) and %s (keep it private: --sign)\n", pub.c_str(), sec.c_str());
  return kExitOk;
}

int run_cache(const Args& args) {
  if (args.words.size() < 2) return usage_error("cache: missing subcommand (ls, show, rm, stats, export, import, put, repair)");
  const std::string& sub = args.words[1];
  if (sub == "ls") return cmd_ls(args);
  if (sub == "show") return cmd_show(args);
  if (sub == "rm") return cmd_rm(args);
  if (sub == "stats") return cmd_stats(args);
  if (sub == "export") return cmd_export(args);
  if (sub == "import") return cmd_import(args);
  if (sub == "put") return run_cache_put(args);
  if (sub == "repair") return cmd_repair(args);
  return usage_error("cache: unknown subcommand '" + sub + "' (ls, show, rm, stats, export, import, put, repair)");
}

}  // namespace kc::cli
