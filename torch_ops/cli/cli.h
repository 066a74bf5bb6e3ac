// Shared pieces of the kernelcraft command-line tool: parsed arguments, output and exit codes.
// The cache commands need only kc_kernel_cache; worker, evolve and verify run the evolution path
// (kc_evolve, which links torch for the eager references in the evaluation child).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace kc {
class Store;
}

namespace kc::cli {

// 0 success; 1 the command failed (missing key, bad file, cache error); 2 the command line is wrong.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct Args {
  std::vector<std::string> words;             // command words and operands, in order
  std::map<std::string, std::string> values;  // --name VALUE options (name without dashes)
  std::map<std::string, bool> flags;          // --name switches
  bool json = false;                          // --json: machine-readable stdout
  std::string cache_dir;                      // --cache-dir, else default_cache_dir()

  // The value of --name, or "".
  std::string value(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::string() : it->second;
  }
  bool flag(const std::string& name) const { return flags.count(name) != 0; }
};

// One line on stderr ("kernelcraft: <msg>"), and the exit code to return.
int fail(const std::string& msg);
int usage_error(const std::string& msg);
// A non-fatal line on stderr ("kernelcraft: warning: <msg>").
void warn(const std::string& msg);
// Pretty (indent 2) or compact JSON on stdout; invalid UTF-8 in sources never throws.
void print_json(const nlohmann::json& j, bool compact);

// `kernelcraft cache <sub> ...` with args.words = {"cache", sub, operands...}.
int run_cache(const Args& args);
// `kernelcraft cache put`: compile and store one kernel (put_cmd.cpp).
int run_cache_put(const Args& args);
// evolve_cmds.cpp
int run_worker_cmd(const Args& args);
int run_evolve_cmd(const Args& args);
int run_verify_cmd(const Args& args);
int run_search_state_cmd(const Args& args);
// `kernelcraft job-check FILE...`: the worker's validation of job files, one JSON line each.
int run_job_check_cmd(const Args& args);
// `cache put --verify`: the gauntlet for the call `key` describes. kExitOk with the verdict JSON when
// verified; otherwise the rejection (or infrastructure error) is reported and its exit code returned.
int verify_for_put(const Args& args, const std::string& key, const std::string& source,
                   const nlohmann::json& launch, nlohmann::json& verdict);

// `cache import --reverify`: the gauntlet (an evaluation child, as verify runs it) for a bundle's
// record. The verdict's evidence when verified; kRejected "<stage>: <summary>" when not; another
// code when the gauntlet could not run (no device, no such op).
Result<nlohmann::json> reverify_for_import(const Args& args, const std::string& key, const std::string& source,
                                           const nlohmann::json& launch);
// The cache for a read command (cache ls, report): a missing cache reads as empty (one note on
// stderr in text mode unless quiet); damage and I/O errors are failures (cache_cmds.cpp).
Result<std::unique_ptr<Store>> open_cache_for_read(const Args& args, bool quiet = false);
// `kernelcraft report [--out FILE]`: the cache as an HTML page, or its data with --json (report_cmd.cpp).
int run_report_cmd(const Args& args);
// `kernelcraft keygen --out DIR`: a bundle-signing key pair (cache_cmds.cpp).
int run_keygen(const Args& args);

}  // namespace kc::cli
