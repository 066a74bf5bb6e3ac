// The live check (shadow verification): some served calls of a key also run the original ATen
// kernel on the same inputs, into outputs of its own, and the two are compared on their device
// within the record's budget. The gauntlet verified the kernel on generated data; this checks it
// on the data the program really has. A match returns the kernel's outputs untouched; a mismatch
// returns eager's, disables the key in this process at once and in the cache for every process
// (on a background thread: kernel_cache/disable.h), with the evidence, and logs one line.
// Which calls: the first `shadow_calls` served calls of a key in this process, then one in
// `shadow_every` on average (hashed, so a periodic program cannot keep the checks off one phase).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "kernel_cache/record.h"

namespace kc::dispatch {

// Is the n-th (0-based) served call of a key with this salt checked? first: shadow_calls;
// every: shadow_every (0: never after the first, 1: always).
bool shadow_due(uint64_t n, uint64_t salt, int first, int every);

// The outcome of comparing one call's outputs.
struct ShadowVerdict {
  bool match = true;
  int output = -1;             // the first output that did not match
  std::string check;           // "error budget" | "layout" | "presence" | "exact" (non-float outputs)
  int64_t index = -1;          // flat index of the largest error in that output
  double error = 0, budget = 0;
  double expected = 0, actual = 0;   // eager's and the kernel's value there
  nlohmann::json to_json() const;
};

// Compares the kernel's outputs with eager's, output by output, on their device (one host sync per
// output, after a cheap upper bound of the error in a few passes; the exact measure below runs only
// where that bound is over the budget or not finite; only checked calls pay any of it). Error per element: |kernel - eager| / (|eager| + tau), tau a
// tenth of the rms of eager's finite values, the gauntlet's mixed measure with eager in place of
// the fp64 reference it has not got here; a non-finite value that eager does not have (or of
// another kind) counts as an infinite error. Within live_budget(record, j) matches. Neither side
// is modified. May throw (allocation); the caller treats that as "not checked".
// On CUDA the bound is one kernel of our own (kernel_cache/live_compare.h) when `cache_dir` holds
// it for the record's target, and ATen ops otherwise.
ShadowVerdict compare_outputs(const std::vector<at::Tensor>& served, const std::vector<at::Tensor>& eager,
                              const Record& record, const std::string& cache_dir);
// Outputs this process bounded with that kernel so far.
uint64_t fused_comparisons();

// Evidence about the inputs of a mismatching call, without the data itself: per tensor its
// dtype, sizes and, for floating point, min, max, largest magnitude, rms and non-finite count.
nlohmann::json summarize_inputs(const std::vector<std::string>& names, const std::vector<const at::Tensor*>& inputs);

// Queues "disable `checked` in the cache at `dir` with `evidence`" for a background thread of this
// process (opening the cache as its writer may wait for the lock); never blocks the caller.
void disable_in_cache(const std::string& dir, std::shared_ptr<const Record> checked, nlohmann::json evidence);
// Waits up to timeout_s for queued disables to be written (process exit, tests). True when none is left.
bool flush_disables(double timeout_s);
// {"queued": n, "written": n, "failed": n, "last_error": "..."}
nlohmann::json disable_status();

}  // namespace kc::dispatch
