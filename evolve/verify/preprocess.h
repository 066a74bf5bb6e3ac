// Macro expansion for the static source check: a candidate's source as the compiler sees it, so a
// rule cannot be walked around with `#define PERSISTENT static`, a pasted `sys##tem` or a
// function-like macro. #include lines are blanked first (the headers' own text would trip every
// rule, and an include alone is not a defect). Findings on the expanded text carry its own line
// numbers. Runs the configured host compiler's preprocessor (`<cxx> -E -P`), so it starts a
// process: a sandboxed evaluation child asks its broker. Both texts are checked: code under an
// #if the host preprocessor drops (__CUDA_ARCH__, __SANITIZE_ADDRESS__) is still in the raw one.
#pragma once
#include <string>

#include "runtime/status.h"

namespace kc::evolve {

// The source with its #include lines blanked and every macro expanded. kCompileError when the
// preprocessor rejects it (the message says why), kUnavailable when it cannot be run.
Result<std::string> expand_macros(const std::string& source);

}  // namespace kc::evolve
