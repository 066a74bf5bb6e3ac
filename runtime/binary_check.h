// What a CPU kernel's shared object may contain, judged on the binary (the static rules only see
// source, which extern "C" prototypes, macros and inline asm walk around). Every CPU load goes
// through check_cpu_binary (cpu_backend.cpp): the evaluation child, the sanitizer runner, the
// user's process and `cache import` alike. Torch-free; libelf reads the ELF, capstone disassembles.
//
// A kernel passes when it
//   - imports only allowlisted symbols (libm's math functions, memcpy/memmove/memset/memcmp, the
//     stack protector and fortify aborts, a few pure libgcc arithmetic helpers) and needs only
//     libc, libm, libgcc_s or libstdc++ (DT_NEEDED);
//   - runs nothing at load or unload: no .init/.fini code, no non-empty .init_array, .fini_array,
//     .preinit_array, .ctors or .dtors, no DT_INIT/DT_FINI(_ARRAY), no IFUNC resolvers (they run
//     during relocation); kernels are linked with -nostartfiles, so honest ones have none at all;
//   - has no system-call instruction (syscall, sysenter, int N; svc/hvc/smc on aarch64) anywhere
//     the loader maps executable, found by a linear disassembly of every executable segment;
//   - has no writable-and-executable segment, no executable stack and no text relocations (each
//     would let the kernel write code at run time and jump to it).
// Limit: a linear sweep cannot follow a computed jump into the middle of an instruction, and no
// binary check stops code that finds a libc function's address by reading memory and calls it;
// the evaluation child's sandbox, not this check, is the boundary for such code.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace kc {

// The first thing wrong with a binary; kNone when it passed.
enum class BinaryFault {
  kNone,
  kMalformed,        // not an ELF shared object for this machine, or its tables do not read
  kImport,           // imports a symbol outside the allowlist
  kLibrary,          // needs a library outside the allowlist (DT_NEEDED)
  kConstructor,      // code that runs at load or unload (init/fini sections or dynamic tags)
  kIfunc,            // an IFUNC symbol or IRELATIVE relocation: a resolver runs while loading
  kSyscall,          // a system-call instruction in executable code
  kWritableCode,     // a segment both writable and executable
  kExecutableStack,  // PT_GNU_STACK missing or executable
  kTextRelocation,   // DT_TEXTREL: the loader makes code writable to relocate it
  kUnavailable,      // the disassembler could not start (the check fails closed)
};

// Which build is being judged. The AddressSanitizer build of an already checked source (the
// gauntlet's sanitizer stage) may also import __asan_*, need libasan and have the
// instrumentation's module constructor; every other rule still applies to it.
enum class BinaryPolicy { kKernel, kSanitizerBuild };

struct BinaryCheck {
  BinaryFault fault = BinaryFault::kNone;
  std::string detail;       // the symbol, library, section, tag or instruction (e.g. "syscall")
  std::string section;      // the section holding it, when known
  std::string function;     // kSyscall: the function holding the instruction, when known
  uint64_t offset = 0;      // kSyscall: file offset of the instruction
  bool ok() const { return fault == BinaryFault::kNone; }
  std::string message() const;          // one line, e.g. "imports 'unlink' (not allowlisted)"
  nlohmann::json to_json() const;       // {"fault": "import", "detail": "unlink", ...}
  Status to_status() const;             // ok, or kRejected with message()
};

// Judges an ELF shared object held in memory. Never throws; bad input is kMalformed.
BinaryCheck check_cpu_binary(const std::string& elf, BinaryPolicy policy = BinaryPolicy::kKernel);

// The name used in JSON and messages ("import", "syscall", ...).
const char* binary_fault_name(BinaryFault f);

}  // namespace kc
