// Hand-made records: compile a kernel someone wrote for a key and store it (CLI `cache put`,
// torch.ops.kernelcraft.put_kernel). Such records say so in meta.provenance ("verified": false).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "kernel_cache/record.h"
#include "runtime/backend.h"
#include "runtime/status.h"

namespace kc {

// Compiles `source` for `target` (a key's target field) on this machine: the CPU backend for
// "cpu-*" targets, which must be this machine's (kInvalid otherwise), NVRTC for "cuda-sm_XX*"
// (no GPU needed). Sets `backend` to the target's kind. Also what bundle import rebuilds with.
Result<CompileOutput> compile_for_target(const std::string& target, const std::string& source, BackendKind* backend);

// Compiles `source` for the target named in `key` (the CPU backend for "cpu-*" targets, which
// must be this machine's; NVRTC for "cuda-sm_XX*") and returns a "served" record.
Result<Record> make_manual_record(const std::string& key, const std::string& source,
                                  const nlohmann::json& launch, const std::string& by);

// A "served" record of a binary built elsewhere (the evaluation child's, which it verified and
// whose hash the caller checked: evolve/worker/worker.h verified_binary): no compile here.
Result<Record> record_of_binary(const std::string& key, const std::string& source, const nlohmann::json& launch,
                                std::string binary);

// Opens `dir` as the writer (waiting for the lock), stores `r` under r.key, closes it again.
Status put_record(const std::string& dir, const Record& r, int lock_wait_ms = 5000);

}  // namespace kc
