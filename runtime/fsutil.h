// Small POSIX file helpers for code that runs inside torch processes. std::filesystem is avoided
// there on purpose: libtorch.so exports its own std::filesystem symbols, and calls from this
// library bound to those and crashed (remove_all, seen on the H200 with torch 2.11).
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace kc {

bool path_exists(const std::string& p);
bool is_directory(const std::string& p);
// mkdir -p; false with errno set on failure.
bool make_dirs(const std::string& p);
// rm -rf without following symlinks; best effort.
void remove_tree(const std::string& p);
// $TMPDIR or /tmp.
std::string temp_root();
// Calls fn(name) for each entry of `dir` except . and ..; false if dir cannot be read.
bool list_dir(const std::string& dir, const std::function<void(const std::string&)>& fn);
// The whole file as bytes ("" and *ok = false when it cannot be read).
std::string read_file(const std::string& path, bool* ok = nullptr);
// Replaces the file's contents; false on any write error.
bool write_file(const std::string& path, std::string_view data);
// The running executable's path (/proc/self/exe), or "".
std::string self_exe();
// FNV-1a 64-bit hash of `bytes` as 16 hex digits (job file names, blob summaries).
std::string fnv1a64_hex(std::string_view bytes);

}  // namespace kc
