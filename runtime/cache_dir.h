// The cache directory as a place other users must not be able to write into, and the files the
// project writes there.
//
// Private by default: a directory we create is 0700; an existing one owned by another user, or
// writable by group or others, is refused (the caller logs one line and runs eager / skips the
// write), because anyone who can write there could plant a symlink or swap a job. With the shared
// setting (`cache_shared`, KERNELCRAFT_CACHE_SHARED) a group may share the directory: it may be
// owned by another user and group-/world-writable, new directories are 0770 and new files 0660.
// Either way every file the project writes in it (worker.lock, worker.log and its rotation, job
// files and their temporaries, jobs/rejected and jobs/failed) is opened with O_NOFOLLOW, and new
// files are created with O_EXCL, so a planted symlink is never written through. RocksDB opens its
// own files (LOCK, LOG, MANIFEST, SSTs) without O_NOFOLLOW; the directory check is what protects
// those.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/status.h"

namespace kc {

// Process-wide; initialised from load_config() on first use, and updated by configure().
bool cache_dir_shared();
void set_cache_dir_shared(bool shared);

// Creates `dir` (and missing parents) if needed, then checks it: a directory (symlinks to one are
// fine: the target is what is checked), owned by us and not group/world-writable unless shared.
// kInvalid with the reason otherwise. Writers call it before writing anything into the cache.
Status prepare_cache_dir(const std::string& dir);
// A subdirectory the project owns (jobs/, jobs/rejected/): created if missing; refused if it is a
// symlink or not a directory.
Status prepare_cache_subdir(const std::string& path);

// Mode bits for new files and directories in the cache under the current policy.
mode_t cache_file_mode();
mode_t cache_dir_mode();

// open(2) with O_NOFOLLOW | O_CLOEXEC added: -1 with errno (ELOOP for a symlink) on failure.
int open_nofollow(const std::string& path, int flags, mode_t mode = 0);
// Creates `path` with O_CREAT | O_EXCL | O_NOFOLLOW and writes `data`; on any error nothing is left
// behind (a file that existed before, or a symlink, is an error and is not touched).
Status write_new_file(const std::string& path, std::string_view data);
// Reads a regular file without following a symlink; kNotFound if absent, kInvalid if it is not a
// regular file or is larger than max_bytes.
Result<std::string> read_regular_file(const std::string& path, size_t max_bytes);

}  // namespace kc
