// Disabling a stored record on evidence from the field (the live check, dispatcher/shadow.h): the
// record stays in the store with state "disabled" and the evidence in meta.disabled, so every
// process serving it drops it at its next catch-up, `kernelcraft cache ls/show` tell why, and the
// worker knows which kernel not to store for the key again (evolve/worker/worker.cpp).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "kernel_cache/record.h"
#include "runtime/status.h"

namespace kc {

// The record `r` with state "disabled" and `evidence` (an object) as meta.disabled; everything else,
// the kernel included, is kept as evidence of what was disabled.
Record disabled_copy(const Record& r, const nlohmann::json& evidence);

// Opens `dir` as the writer (waiting for the lock up to lock_wait_ms) and disables the record under
// `checked.key` if it still holds the kernel that was checked (same blob and launch spec). A record
// replaced or removed meanwhile is left alone: kNotFound. Already disabled: ok, unchanged.
Status disable_stored(const std::string& dir, const Record& checked, const nlohmann::json& evidence,
                      int lock_wait_ms = 10000);

// True when `a` and `b` are the same kernel: same source, launch spec and binary.
bool same_kernel(const Record& a, const Record& b);

}  // namespace kc
