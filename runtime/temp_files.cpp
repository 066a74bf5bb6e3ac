// Owned temporaries and the sweep of those whose owner died (temp_files.h).
#include "runtime/temp_files.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "runtime/fsutil.h"

namespace kc {
namespace {

// Every tag this project creates under temp_root(); nothing else there is ever swept.
constexpr const char* kTags[] = {"calls", "sanitize", "asan-path", "put", "probe", "so", "cc", "eval"};

// The owner's pid of a name kc-<tag>-<pid>[-.]..., or -1 for any other name.
long owner_pid(const std::string& name) {
  for (const char* tag : kTags) {
    const std::string prefix = std::string("kc-") + tag + "-";
    if (name.rfind(prefix, 0) != 0) continue;
    size_t i = prefix.size(), j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j == i || j - i > 9 || (j < name.size() && name[j] != '-' && name[j] != '.')) continue;
    return std::strtol(name.substr(i, j - i).c_str(), nullptr, 10);
  }
  return -1;
}

bool process_gone(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

}  // namespace

std::string owned_temp_path(const std::string& tag) {
  return temp_root() + "/kc-" + tag + "-" + std::to_string(getpid());
}

ScopedTempDir::ScopedTempDir(const std::string& tag) {
  std::string tmpl = owned_temp_path(tag) + "-XXXXXX";
  if (mkdtemp(tmpl.data())) path_ = tmpl;
}

ScopedTempDir::~ScopedTempDir() {
  if (!path_.empty()) remove_tree(path_);
}

RemoveAtScopeEnd::~RemoveAtScopeEnd() {
  if (!path_.empty()) remove_tree(path_);
}

int sweep_stale_temp() {
  const std::string root = temp_root();
  std::vector<std::string> stale;
  list_dir(root, [&](const std::string& name) {
    struct stat st{};
    const std::string p = root + "/" + name;
    if (::lstat(p.c_str(), &st) == 0 && st.st_uid == ::getuid() && process_gone(owner_pid(name))) stale.push_back(p);
  });
  for (const auto& p : stale) {
    struct stat st{};
    if (::lstat(p.c_str(), &st) != 0) continue;   // another sweeper was first
    if (S_ISDIR(st.st_mode)) remove_tree(p);
    else ::unlink(p.c_str());
  }
  return static_cast<int>(stale.size());
}

}  // namespace kc
