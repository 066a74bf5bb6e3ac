// The sandboxed evaluation child's broker: a process forked from it before it is sandboxed (and
// before torch starts threads), which starts the processes the child itself may no longer start
// (sandbox.h): the host compiler for each CPU candidate, and the sanitizer stage (the ASan build,
// the bundle written to its own directory, the runners, which sandbox themselves). The two talk
// over a socketpair; every request is something the child could ask for unsandboxed, so a
// candidate that reaches the socket gains nothing: a compile of its own source, or a sanitizer run
// under the same sandbox. The broker exits when the child closes the socket or dies.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "evolve/verify/gauntlet.h"
#include "evolve/verify/sanitizers.h"
#include "runtime/backend.h"
#include "runtime/status.h"

namespace kc::evolve {

class Broker {
 public:
  // Forks the broker with `o` (its sanitizer settings). This process must have one thread, so
  // that no lock the broker inherits is held by a thread it does not have; kUnavailable otherwise.
  static Result<std::unique_ptr<Broker>> start(const GauntletOptions& o);
  ~Broker();   // closes the socket (the broker exits) and reaps it
  Broker(const Broker&) = delete;
  Broker& operator=(const Broker&) = delete;

  // expand_macros(source) in the broker (preprocess.h).
  Result<std::string> preprocess(const std::string& source);
  // cpu_compile(source) in the broker.
  Result<CompileOutput> compile(const std::string& source);
  // run_sanitizers(run, o) in the broker; a broken channel is a rejected stage saying so.
  StageReport sanitize(const SanitizerRun& run);
  // True once a request failed on the channel (the broker died, or something wrote into the
  // socket): this child can compile nothing more and should be replaced.
  bool broken() const { return broken_; }

 private:
  Broker(int fd, int pid) : fd_(fd), pid_(pid) {}
  int fd_ = -1, pid_ = -1;
  uint64_t seq_ = 0;
  bool broken_ = false;
};

}  // namespace kc::evolve
