// A host emulation of CUDA template kernels for the template tests without a GPU: a Backend that
// compiles a rendered CUDA source with the host compiler, behind a shim that maps the CUDA
// builtins the templates use onto plain C++, and launches every thread of the grid in turn on the
// calling thread. It checks what a template computes (indexing, windows, tails, vector loads,
// knob interplay), not how the GPU runs it: the fast-math intrinsics are their exact functions,
// and only kernels whose threads never talk to each other can run this way, so sources with
// shared memory, barriers, warp shuffles or votes, atomics or inline PTX are refused as
// kUnsupported (the GPU tests cover those). Test-only: nothing here is a sandbox, and it loads
// the compiled object into the test process.
#pragma once
#include <string>

#include "runtime/backend.h"

namespace kc::evolve::gpu_run {

// Why `source` cannot be emulated (the first construct found), or "" when it can.
std::string emu_refusal(const std::string& source);

// The emulating backend (process-wide). Its kind is kCuda, since the launch specs it runs are the
// CUDA templates'; compile fails with kUnsupported where emu_refusal does.
Backend& emu_backend();

}  // namespace kc::evolve::gpu_run
