// The RocksDB store behind store.h: option choices, the writer's lock retry, the per-process
// secondary directory, and RocksDB statuses mapped onto kc::Status. Nothing here throws or aborts.
#include "kernel_cache/store.h"
#include "runtime/cache_dir.h"
#include "runtime/fsutil.h"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdarg>
#include <cstdlib>
#include <thread>
#include <vector>

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>

namespace kc {
namespace {


// RocksDB's info LOG would grow in the cache directory of every serving process (and cannot be
// created at all in a read-only one); a logger that drops everything keeps the directory clean.
class NullLogger : public rocksdb::Logger {
 public:
  NullLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::HEADER_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* /*format*/, va_list /*ap*/) override {}
};

rocksdb::Options base_options(Store::Mode mode) {
  rocksdb::Options o;
  // Compression off at every level and for every kind of file: a compressed flush segfaulted inside
  // CUDA-initialised torch processes (store.h), and records are small.
  o.compression = rocksdb::kNoCompression;
  o.compression_per_level.clear();
  o.bottommost_compression = rocksdb::kDisableCompressionOption;
  o.blob_compression_type = rocksdb::kNoCompression;
  o.wal_compression = rocksdb::kNoCompression;
  o.info_log = std::make_shared<NullLogger>();
  o.keep_log_file_num = 1;
  o.stats_dump_period_sec = 0;
  o.stats_persist_period_sec = 0;
  // Kernel records are KBs to a few MBs; a small memtable keeps the WAL that secondaries tail short.
  o.write_buffer_size = 8 << 20;
  o.create_if_missing = (mode == Store::Mode::kWriter);
  // Secondaries require -1 (they must keep every SST open while the primary may delete them).
  o.max_open_files = (mode == Store::Mode::kReader) ? -1 : 64;
  return o;
}

Status map_status(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::ok();
  std::string msg = what + ": " + s.ToString();
  if (s.IsNotFound()) return Status::error(Code::kNotFound, msg);
  if (s.IsCorruption()) return Status::error(Code::kCorrupt, msg);
  if (s.IsBusy() || s.IsTryAgain()) return Status::error(Code::kBusy, msg);
  return Status::error(Code::kIOError, msg);
}

bool is_lock_error(const rocksdb::Status& s) {
  if (!s.IsIOError()) return false;
  std::string m = s.ToString();
  std::string lower(m.size(), ' ');
  std::transform(m.begin(), m.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("lock") != std::string::npos ||
         lower.find("resource temporarily unavailable") != std::string::npos;
}

const char* kSecondaryPrefix = "kernelcraft-secondary-";

// Secondary directories of processes that died without closing: removed when the next reader of
// the same user opens, so /tmp does not fill up. Only names carrying our uid are touched.
void remove_stale_secondaries() {
  std::string mine = std::string(kSecondaryPrefix) + std::to_string(getuid()) + "-";
  const std::string root = temp_root();
  list_dir(root, [&](const std::string& name) {
    if (name.compare(0, mine.size(), mine) != 0) return;
    long pid = std::strtol(name.c_str() + mine.size(), nullptr, 10);
    if (pid <= 0 || pid == getpid()) return;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return;
    remove_tree(root + "/" + name);
  });
}

std::string new_secondary_path() {
  static std::atomic<int> counter{0};
  return temp_root() + "/" + kSecondaryPrefix + std::to_string(getuid()) + "-" +
         std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

class RocksStore final : public Store {
 public:
  RocksStore(std::unique_ptr<rocksdb::DB> db, Mode mode, std::string dir, std::string secondary)
      : db_(std::move(db)), mode_(mode), dir_(std::move(dir)), secondary_(std::move(secondary)) {}

  ~RocksStore() override {
    if (db_ && mode_ == Mode::kWriter) compact_if_needed();
    if (db_) db_->Close().PermitUncheckedError();  // nothing useful to do with a failed close
    db_.reset();
    if (!secondary_.empty()) remove_tree(secondary_);
  }

  Mode mode() const override { return mode_; }
  const std::string& dir() const override { return dir_; }

  Result<std::string> get(const std::string& key) override {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
    if (s.IsNotFound()) return Status::error(Code::kNotFound, "no record for key");
    if (!s.ok()) return map_status(s, "get from " + dir_);
    return value;
  }

  Status put(const std::string& key, const std::string& value) override {
    KC_RETURN_IF_ERROR(check_writer("put"));
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return map_status(db_->Put(wo, key, value), "put into " + dir_);
  }

  Status remove(const std::string& key) override {
    KC_RETURN_IF_ERROR(check_writer("remove"));
    rocksdb::WriteOptions wo;
    wo.sync = true;
    return map_status(db_->Delete(wo, key), "remove from " + dir_);
  }

  Status scan(const std::string& prefix,
              const std::function<bool(const std::string&, const std::string&)>& fn, size_t* damaged) override {
    std::string last;   // the last key visited: where to resume past a damaged region
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    it->Seek(prefix);
    for (int skips = 0;; ++skips) {
      for (; it->Valid(); it->Next()) {
        rocksdb::Slice k = it->key();
        if (!k.starts_with(prefix)) return Status::ok();
        last = k.ToString();
        if (!fn(last, it->value().ToString())) return Status::ok();
      }
      if (it->status().ok()) return Status::ok();
      // Checksums stay on: without them RocksDB parses damaged blocks and was seen to abort the
      // process on an assertion. Past a damaged block, resume at the smallest key that skips it.
      if (!damaged || skips >= kMaxSkips) return map_status(it->status(), "scan of " + dir_);
      ++*damaged;
      if (!resume_after(it, last.empty() ? prefix : last)) return Status::ok();
    }
  }

  Status catch_up() override {
    if (mode_ != Mode::kReader) return Status::ok();
    return map_status(db_->TryCatchUpWithPrimary(), "catch up with " + dir_);
  }
  uint64_t sequence() const override { return db_->GetLatestSequenceNumber(); }

 private:
  static constexpr int kMaxSkips = 256;
  // Seeks a fresh iterator past `after` with jumps of growing size: successors of ever shorter
  // prefixes of it (the damaged block's keys share the longest prefixes with `after`). False when
  // every jump lands in damage too, or past the end.
  bool resume_after(std::unique_ptr<rocksdb::Iterator>& it, const std::string& after) {
    for (size_t i = after.size(); i-- > 0;) {
      if (static_cast<unsigned char>(after[i]) == 0xff) continue;
      std::string next = after.substr(0, i);
      next.push_back(static_cast<char>(static_cast<unsigned char>(after[i]) + 1));
      it.reset(db_->NewIterator(rocksdb::ReadOptions()));
      it->Seek(next);
      if (it->status().ok()) return it->Valid();
    }
    return false;
  }

 private:
  // Writers live for a put or two, and each reopen flushes the previous session's WAL into its own
  // small table file. Background compaction only moves those files down a level untouched (their
  // key ranges do not overlap), so the file count grows by one per session (seen: 20 files after
  // 23 sessions). Secondaries must keep every table file open (max_open_files = -1), so thousands
  // of sessions would mean thousands of descriptors in every serving process. Merging everything
  // into one file now and then keeps that bounded; records are small, so it is cheap.
  void compact_if_needed() {
    std::vector<rocksdb::LiveFileMetaData> files;
    db_->GetLiveFilesMetaData(&files);
    if (files.size() < kMaxTableFiles) return;
    rocksdb::CompactRangeOptions co;
    co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    db_->CompactRange(co, nullptr, nullptr).PermitUncheckedError();  // best effort; data is safe
  }
  static constexpr size_t kMaxTableFiles = 16;

  Status check_writer(const char* what) const {
    if (mode_ == Mode::kWriter) return Status::ok();
    return Status::error(Code::kUnsupported,
                         std::string(what) + ": the cache at " + dir_ + " is open for reading only");
  }

  std::unique_ptr<rocksdb::DB> db_;
  Mode mode_;
  std::string dir_;
  std::string secondary_;  // kReader only: removed on close
};

}  // namespace

void construct_rocksdb_singletons() { rocksdb::Env::Default(); }

// RocksDB's own files: a MANIFEST, table files, write-ahead logs (digits + ".log"; worker.log is ours).
bool has_database_files(const std::string& dir) {
  bool found = false;
  list_dir(dir, [&](const std::string& n) {
    const auto ends = [&](const char* sfx) {
      const size_t k = std::strlen(sfx);
      return n.size() > k && n.compare(n.size() - k, k, sfx) == 0;
    };
    const bool wal = ends(".log") && std::isdigit(static_cast<unsigned char>(n[0]));
    if (n.rfind("MANIFEST-", 0) == 0 || ends(".sst") || wal) found = true;
  });
  return found;
}

Status repair_database(const std::string& dir) {
  if (!has_database_files(dir)) return Status::error(Code::kNotFound, "no kernel cache files in " + dir);
  rocksdb::Status s = rocksdb::RepairDB(dir, base_options(Store::Mode::kWriter));
  return s.ok() ? Status::ok() : map_status(s, "repair " + dir);
}

namespace {

// A database whose CURRENT is gone but whose files are still there is damaged, not absent. Opening
// it with create_if_missing would start an empty database over it and delete the old table files
// as obsolete (seen: 2000 records became 157 after `rm CURRENT` and two puts), so nobody may.
// A writer creating the database writes its MANIFEST before CURRENT: while it holds the database's
// LOCK (an fcntl lock, RocksDB's own), files without CURRENT are a database being made, not a
// damaged one (kBusy: wait for it like for any writer).
Status check_not_orphaned(const std::string& dir) {
  if (path_exists(dir + "/CURRENT") || !has_database_files(dir)) return Status::ok();
  const int fd = ::open((dir + "/LOCK").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    struct flock fl{};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    const bool held = ::fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
    ::close(fd);
    if (held) return Status::error(Code::kBusy, "kernel cache in " + dir + " is being created by another process");
  }
  return Status::error(Code::kCorrupt, "kernel cache in " + dir + " is damaged: CURRENT is missing but its "
                       "database files are there; nothing was changed (`kernelcraft cache repair` salvages it)");
}

Result<std::unique_ptr<rocksdb::DB>> open_writer(const std::string& dir, int lock_wait_ms) {
  // Created private, or checked to be ours and not writable by others (runtime/cache_dir.h).
  KC_RETURN_IF_ERROR(prepare_cache_dir(dir));
  rocksdb::Options o = base_options(Store::Mode::kWriter);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, lock_wait_ms));
  int backoff_ms = 5;
  for (;;) {
    Status orphan = check_not_orphaned(dir);
    rocksdb::Status s = rocksdb::Status::Busy("being created");
    if (!orphan.is_ok() && orphan.code() != Code::kBusy) return orphan;
    if (orphan.is_ok()) {
      rocksdb::DB* raw = nullptr;
      s = rocksdb::DB::Open(o, dir, &raw);
      if (s.ok()) return std::unique_ptr<rocksdb::DB>(raw);
      delete raw;
      if (!is_lock_error(s)) return map_status(s, "open " + dir + " for writing");
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return Status::error(Code::kBusy, "cache " + dir + " is locked by another writer (waited " +
                                            std::to_string(lock_wait_ms) + " ms): " + s.ToString());
    // Writers hold the lock only for a put or two, so short sleeps first, growing to 100 ms.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<long long>(backoff_ms, left + 1)));
    backoff_ms = std::min(backoff_ms * 2, 100);
  }
}

Result<std::unique_ptr<Store>> open_impl(const std::string& dir, Store::Mode mode, int lock_wait_ms) {
  if (dir.empty()) return Status::error(Code::kInvalid, "empty cache directory");
  if (mode == Store::Mode::kWriter) {
    auto db = open_writer(dir, lock_wait_ms);
    if (!db) return db.status();
    return std::unique_ptr<Store>(new RocksStore(std::move(db).value(), mode, dir, ""));
  }
  // Readers never create anything in `dir`: a missing database, or one a writer is creating, is
  // simply "nothing cached yet"; files left without CURRENT by nobody are damage.
  if (Status orphan = check_not_orphaned(dir); !orphan.is_ok()) {
    if (orphan.code() != Code::kBusy) return orphan;
    return Status::error(Code::kNotFound, "no kernel cache in " + dir + " yet (" + orphan.message() + ")");
  }
  if (!path_exists(dir + "/CURRENT"))
    return Status::error(Code::kNotFound, "no kernel cache in " + dir);
  rocksdb::Options o = base_options(mode);
  rocksdb::DB* raw = nullptr;
  if (mode == Store::Mode::kReadOnly) {
    rocksdb::Status s = rocksdb::DB::OpenForReadOnly(o, dir, &raw);
    if (!s.ok()) {
      delete raw;
      return map_status(s, "open " + dir + " read-only");
    }
    return std::unique_ptr<Store>(new RocksStore(std::unique_ptr<rocksdb::DB>(raw), mode, dir, ""));
  }
  // RocksDB 7.8's secondary reads the MANIFEST with a reader that can spin forever on a damaged
  // one (seen: 300 random bytes as MANIFEST hung OpenAsSecondary in TryReadFragment; a CI run timed
  // out on it). The read-only open reads it with the ordinary reader, which reports Corruption, so
  // it screens the database first. It costs one extra open per process.
  {
    rocksdb::Status s = rocksdb::DB::OpenForReadOnly(base_options(Store::Mode::kReadOnly), dir, &raw);
    delete raw;
    raw = nullptr;
    if (!s.ok()) return map_status(s, "open " + dir + " (screening before the secondary open)");
  }
  remove_stale_secondaries();
  std::string secondary = new_secondary_path();
  if (!make_dirs(secondary))
    return Status::error(Code::kIOError, "cannot create " + secondary + ": " + std::strerror(errno));
  rocksdb::Status s = rocksdb::DB::OpenAsSecondary(o, dir, secondary, &raw);
  if (!s.ok()) {
    delete raw;
    remove_tree(secondary);
    return map_status(s, "open " + dir + " as secondary");
  }
  return std::unique_ptr<Store>(new RocksStore(std::unique_ptr<rocksdb::DB>(raw), mode, dir, secondary));
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const std::string& dir, Mode mode, int lock_wait_ms) {
  // RocksDB reports errors as statuses, but allocation can throw; the boundary
  // catches everything so a broken cache never takes down the user's process.
  try {
    return open_impl(dir, mode, lock_wait_ms);
  } catch (const std::exception& e) {
    return Status::error(Code::kIOError, "open " + dir + ": " + e.what());
  }
}

std::string default_cache_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  std::string d = env("KERNELCRAFT_CACHE_DIR");
  if (!d.empty()) return d;
  // XDG says relative values are invalid and must be ignored.
  std::string xdg = env("XDG_CACHE_HOME");
  if (!xdg.empty() && xdg[0] == '/') return xdg + "/kernelcraft";
  std::string home = env("HOME");
  if (home.empty()) {
    if (const passwd* pw = getpwuid(getuid())) home = pw->pw_dir ? pw->pw_dir : "";
  }
  if (!home.empty()) return home + "/.cache/kernelcraft";
  return temp_root() + "/kernelcraft-cache-" + std::to_string(getuid());
}

}  // namespace kc
