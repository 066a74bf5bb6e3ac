// A restartable evaluation child for one call (child.h speaks its protocol): the worker's and
// `verify`'s handle on the process that runs candidates. A crash, a hang past the candidate
// timeout or a device fault of the child becomes a verdict ("crash", "timeout") whose evidence
// says where it died (the child's last progress line: stage, input set, call), how (signal or
// exit status) and the last lines of its stderr; a CPU candidate that crashed is then run once
// under AddressSanitizer on the input set it died on, so an out-of-bounds access is reported with
// its source line (verdict stage "sanitizer"). The next candidate gets a fresh child.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/worker/worker.h"
#include "runtime/status.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"

namespace kc::evolve {

// One evaluation child for one call; restarted after a crash, a hang or a device fault.
class ChildSession {
 public:
  ChildSession(std::vector<std::string> argv, const EvolveOptions& o) : argv_(std::move(argv)), o_(o) {}

  Status ensure();

  const nlohmann::json& ready() const { return ready_; }

  // The verdict JSON for one candidate; crashes and hangs become verdicts too. Error: the child
  // itself cannot run (not the candidate's fault).
  Result<nlohmann::json> evaluate(const std::string& id, const std::string& source, const nlohmann::json& launch,
                                  const std::string& mode);

 private:
  Result<nlohmann::json> request(const std::string& id, const std::string& source, const nlohmann::json& launch,
                                 const std::string& mode, const std::string& set);
  nlohmann::json crash_verdict(const std::string& stage, const std::string& why, const std::string& how);
  // After a CPU crash: the candidate under AddressSanitizer on the set it died on, when that names it.
  void explain_crash(nlohmann::json& verdict, const std::string& id, const std::string& source,
                     const nlohmann::json& launch);
  std::string died();
  std::string stderr_tail();
  void forward_stderr();
  Status last_fail(const std::string& why);
  void reset();

  std::vector<std::string> argv_;
  const EvolveOptions& o_;
  std::unique_ptr<PipedChild> child_;
  nlohmann::json ready_;
  nlohmann::json last_at_;            // the child's last progress line for the current candidate
  ScopedTempDir dir_{"eval"};         // the child's stderr, forwarded to ours after each answer
  long forwarded_ = 0;
  int starts_ = 0;
  std::string last_error_;
};

}  // namespace kc::evolve
