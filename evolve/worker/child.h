// The evaluation child: a process with its own CUDA context that runs candidates through the
// gauntlet for one call and answers line by line, so a candidate that crashes or hangs ends only
// this process. Protocol (one JSON object per line):
//   child -> parent  {"ready": true, "eager": {median_ms, mad_ms, ...}, "sets": [...]}  or {"fatal": "why"}
//   parent -> child  {"id": "...", "source": "...", "launch": {...}, "mode": "search" | "full"}
//   child -> parent  {"id": "...", "verdict": {...}}   (Verdict::to_json)
#pragma once

namespace kc::evolve {

// `kernelcraft eval-child (--job PATH | --call PATH) [--device N]`; returns the exit code.
int eval_child_main(int argc, char** argv);

}  // namespace kc::evolve
