// Cache directory policy and no-follow file creation; see cache_dir.h.
#include "runtime/cache_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cerrno>
#include <cstring>

#include "runtime/config.h"
#include "runtime/fsutil.h"

namespace kc {
namespace {

// -1: not read yet (load_config on first use); 0/1 afterwards.
std::atomic<int> g_shared{-1};

std::string err(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

bool cache_dir_shared() {
  int v = g_shared.load();
  if (v < 0) {
    v = load_config().cache_shared ? 1 : 0;
    int expected = -1;
    g_shared.compare_exchange_strong(expected, v);
    v = g_shared.load();
  }
  return v == 1;
}

void set_cache_dir_shared(bool shared) { g_shared.store(shared ? 1 : 0); }

mode_t cache_file_mode() { return cache_dir_shared() ? 0660 : 0600; }
mode_t cache_dir_mode() { return cache_dir_shared() ? 0770 : 0700; }

Status prepare_cache_dir(const std::string& dir) {
  if (dir.empty()) return Status::error(Code::kInvalid, "empty cache directory");
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::error(Code::kIOError, err("cannot inspect cache directory " + dir));
    const size_t slash = dir.find_last_of('/');
    if (slash != std::string::npos && slash > 0 && !make_dirs(dir.substr(0, slash)))
      return Status::error(Code::kIOError, err("cannot create " + dir.substr(0, slash)));
    // mkdir's mode is what makes a new cache private; an existing one is checked below instead.
    if (::mkdir(dir.c_str(), cache_dir_mode()) != 0 && errno != EEXIST)
      return Status::error(Code::kIOError, err("cannot create cache directory " + dir));
    if (::stat(dir.c_str(), &st) != 0) return Status::error(Code::kIOError, err("cannot inspect " + dir));
  }
  if (!S_ISDIR(st.st_mode)) return Status::error(Code::kInvalid, "cache directory " + dir + " is not a directory");
  if (cache_dir_shared()) return Status::ok();
  if (st.st_uid != ::geteuid())
    return Status::error(Code::kInvalid, "cache directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                                             ", not by us; refusing to write there (set cache_shared for a shared cache)");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return Status::error(Code::kInvalid, "cache directory " + dir +
                                             " is writable by group or others; refusing to write there "
                                             "(chmod 700 it, or set cache_shared for a shared cache)");
  return Status::ok();
}

Status prepare_cache_subdir(const std::string& path) {
  if (::mkdir(path.c_str(), cache_dir_mode()) != 0 && errno != EEXIST)
    return Status::error(Code::kIOError, err("cannot create " + path));
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return Status::error(Code::kIOError, err("cannot inspect " + path));
  if (!S_ISDIR(st.st_mode)) return Status::error(Code::kInvalid, path + " is not a directory (a symlink?); refusing it");
  if (!cache_dir_shared() && st.st_uid != ::geteuid())
    return Status::error(Code::kInvalid, path + " is owned by uid " + std::to_string(st.st_uid) + "; refusing it");
  return Status::ok();
}

int open_nofollow(const std::string& path, int flags, mode_t mode) {
  return ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

Status write_new_file(const std::string& path, std::string_view data) {
  int fd = open_nofollow(path, O_WRONLY | O_CREAT | O_EXCL, cache_file_mode());
  if (fd < 0) return Status::error(Code::kIOError, err("cannot create " + path));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = Status::error(Code::kIOError, err("cannot write " + path));
      ::close(fd);
      ::unlink(path.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    Status s = Status::error(Code::kIOError, err("cannot write " + path));
    ::unlink(path.c_str());
    return s;
  }
  return Status::ok();
}

Result<std::string> read_regular_file(const std::string& path, size_t max_bytes) {
  int fd = open_nofollow(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0)
    return Status::error(errno == ENOENT ? Code::kNotFound : Code::kIOError, err("cannot open " + path));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return Status::error(Code::kInvalid, path + " is not a regular file of at most " + std::to_string(max_bytes) + " bytes");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);   // a file truncated while we read is simply shorter (and will not parse)
  return out;
}

}  // namespace kc
