// Cache repair (repair.h): backup, RocksDB's RepairDB, then a pass that drops undecodable records.
#include "kernel_cache/repair.h"

#include <unistd.h>

#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "kernel_cache/key.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/fsutil.h"

namespace kc {
namespace {

bool is_database_file(const std::string& n) {
  if (n == "CURRENT" || n == "IDENTITY" || n.rfind("MANIFEST-", 0) == 0 || n.rfind("OPTIONS-", 0) == 0) return true;
  const auto ends = [&](const char* sfx) {
    const std::string x(sfx);
    return n.size() > x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
  };
  return ends(".sst") || (ends(".log") && n[0] >= '0' && n[0] <= '9');
}

// Copies the database files (not our own worker.log, jobs/ or earlier backups) into a new folder.
Result<std::string> back_up(const std::string& dir) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&now));
  std::string backup = dir + "/repair-backup-" + stamp;
  for (int i = 1; path_exists(backup); ++i) backup = dir + "/repair-backup-" + stamp + "." + std::to_string(i);
  if (!make_dirs(backup)) return Status::error(Code::kIOError, "cannot create " + backup);
  std::vector<std::string> names;
  list_dir(dir, [&](const std::string& n) {
    if (is_database_file(n)) names.push_back(n);
  });
  for (const auto& n : names) {
    bool ok = false;
    const std::string bytes = read_file(dir + "/" + n, &ok);
    if (!ok || !write_file(backup + "/" + n, bytes))
      return Status::error(Code::kIOError, "cannot back up " + dir + "/" + n + " into " + backup + "; nothing was repaired");
  }
  return backup;
}

// Writes `entries` into a fresh database in `dir`, in place of the damaged one (already backed up):
// RocksDB's repair keeps a table with a damaged block as it is, so its readable records are copied
// out and the database is rebuilt without it.
Status rebuild(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& entries) {
  std::vector<std::string> names;
  list_dir(dir, [&](const std::string& n) {
    if (is_database_file(n) || n == "LOCK" || n.rfind("LOG", 0) == 0) names.push_back(n);
  });
  for (const auto& n : names) unlink((dir + "/" + n).c_str());
  auto st = Store::open(dir, Store::Mode::kWriter, 10000);
  if (!st) return st.status();
  for (const auto& [k, v] : entries) KC_RETURN_IF_ERROR(st.value()->put(k, v));
  return Status::ok();
}

}  // namespace

Result<RepairReport> repair_cache(const std::string& dir) {
  if (!has_database_files(dir)) return Status::error(Code::kNotFound, "no kernel cache files in " + dir);
  RepairReport rep;
  auto backup = back_up(dir);
  if (!backup) return backup.status();
  rep.backup_dir = backup.value();
  // RocksDB's repair only where the database cannot be opened at all (a lost CURRENT, a broken
  // MANIFEST): it drops a table with a damaged block whole (seen: 0 of 400 records left after one
  // flipped 4 KiB), where reading around the block keeps all but a few.
  auto opened = Store::open(dir, Store::Mode::kWriter, 10000);
  if (!opened && opened.status().code() == Code::kCorrupt) {
    KC_RETURN_IF_ERROR(repair_database(dir));
    rep.rocksdb_repair = true;
    opened = Store::open(dir, Store::Mode::kWriter, 10000);
  }
  std::vector<std::pair<std::string, std::string>> keep;
  std::vector<std::string> bad;
  {
    auto st = std::move(opened);
    if (!st) return st.status();
    Status s = st.value()->scan("", [&](const std::string& key, const std::string& value) {
      const bool record = key.rfind(kRecordKeyPrefix, 0) == 0;
      auto rec = record ? decode_record(value) : Result<Record>(Status::error(Code::kInvalid, "not a record"));
      if (record && !(rec && rec->key == key)) {
        bad.push_back(key);
        return true;
      }
      ++(record ? rep.records : rep.other);
      keep.emplace_back(key, value);
      return true;
    }, &rep.damaged);
    if (!s) return s;
    rep.dropped = bad.size();
    if (!rep.damaged) {
      for (const auto& k : bad) KC_RETURN_IF_ERROR(st.value()->remove(k));
      return rep;
    }
  }
  KC_RETURN_IF_ERROR(rebuild(dir, keep));
  return rep;
}

}  // namespace kc
