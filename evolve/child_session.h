// A restartable evaluation child for one call (child.h speaks its protocol): the worker's and
// `verify`'s handle on the process that runs candidates. A crash, a hang past the candidate
// timeout or a device fault of the child becomes a verdict ("crash", "timeout"); the next
// candidate gets a fresh child.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/worker.h"
#include "runtime/status.h"
#include "runtime/subprocess.h"

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
  static nlohmann::json crash_verdict(const std::string& stage, const std::string& why);
  std::string died();
  Status last_fail(const std::string& why);
  void reset();

  std::vector<std::string> argv_;
  const EvolveOptions& o_;
  std::unique_ptr<PipedChild> child_;
  nlohmann::json ready_;
  int starts_ = 0;
  std::string last_error_;
};

}  // namespace kc::evolve
