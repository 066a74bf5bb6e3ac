// The gauntlet's most expensive stage: the candidate alone in a child process, under
// compute-sanitizer memcheck, racecheck, initcheck and synccheck (concurrently), on
// kernelcraft-sanitize, a torch-free runner that allocates every buffer at its exact size. The CPU
// backend rebuilds the kernel with AddressSanitizer and preloads its runtime into the runner.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/verify/gauntlet.h"

namespace kc::evolve {

struct SanitizerRun {
  BackendKind backend = BackendKind::kCpu;
  int device = 0;
  std::string source;                 // rebuilt with ASan on the CPU backend
  std::string binary;                 // the CUBIN (cuda)
  nlohmann::json call, launch;        // OpCall JSON and launch spec
  std::vector<std::string> inputs;    // each input's bytes in schema order ("" for absent ones)
};

// "passed" (every tool clean), "rejected" (the first error with its source line in the summary,
// every tool's output in the evidence) or "skipped" (no compute-sanitizer / ASan runtime).
StageReport run_sanitizers(const SanitizerRun& run, const GauntletOptions& o);

}  // namespace kc::evolve
