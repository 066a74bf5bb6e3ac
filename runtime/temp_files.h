// Temporary files and directories under temp_root(): every one is named kc-<tag>-<pid>[-...] after
// the process that owns it, removed on the normal path by its owner (ScopedTempDir, or the owner's
// own cleanup), and swept by sweep_stale_temp() once that process is dead, so a crash, a kill -9
// or a timeout that skipped the cleanup does not leave it behind for good.
#pragma once
#include <string>
#include <utility>

namespace kc {

// temp_root()/kc-<tag>-<this pid>: for what a process keeps one of (the worker's call files).
std::string owned_temp_path(const std::string& tag);

// A fresh directory temp_root()/kc-<tag>-<pid>-XXXXXX, removed with everything in it when this goes
// out of scope. ok() is false when it could not be created.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& tag);
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Removes the tree at `path` when it goes out of scope: an owned path that is reused by its owner
// (the worker's call files, the sanitizer's work directory) goes on every way out.
class RemoveAtScopeEnd {
 public:
  explicit RemoveAtScopeEnd(std::string path) : path_(std::move(path)) {}
  ~RemoveAtScopeEnd();
  RemoveAtScopeEnd(const RemoveAtScopeEnd&) = delete;
  RemoveAtScopeEnd& operator=(const RemoveAtScopeEnd&) = delete;

 private:
  std::string path_;
};

// Removes entries of temp_root() that this project names (the tags in temp_files.cpp), that belong
// to this user and whose owning process no longer exists; returns how many. Cheap (one readdir).
int sweep_stale_temp();

}  // namespace kc
