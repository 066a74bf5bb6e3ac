// The evolution driver: one key's search through an evaluation child, promotion into the cache,
// and the worker daemon that takes jobs from the cache directory (runtime/worker_client.h).
// Torch-free: everything that runs candidates lives in the child (child.h).
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/llm.h"
#include "evolve/search/search.h"
#include "kernel_cache/key.h"
#include "kernel_cache/record.h"
#include "runtime/status.h"
#include "runtime/worker_client.h"

namespace kc::evolve {

// Where one key's search stands, reported after every candidate (for progress displays).
struct SearchProgress {
  int generation = 0;                // the generation being evaluated (0-based)
  int max_generations = 0;
  int evaluated = 0;                 // candidates evaluated so far for this key (resumed ones included)
  double eager_ms = 0;               // 0 until the evaluation child timed eager
  double best_ms = 0;                // fastest verified candidate so far; 0 when none yet
};

struct EvolveOptions {
  std::string cache_dir;
  std::string self_exe;              // the kernelcraft executable (runs `eval-child`)
  SearchOptions search;
  double gpu_share = 1.0;            // fraction of wall time evaluation may take (sleep the rest)
  double candidate_timeout_s = 180;  // per candidate in the child (sanitizers included); then killed
  double setup_timeout_s = 600;      // the child's reference setup and eager timing
  double min_gain = 0.03;            // promoted only if faster than eager by this fraction ...
  double min_pair_wins = 0.9;        // ... and win this fraction of the pairs timed interleaved
  int max_promote_tries = 3;         // candidates taken through the full gauntlet, fastest first
  int jobs = 1;                      // keys searched concurrently by the worker
  double memory_share = 0.5;         // the CPU evaluation child's memory cap (evolve/verify/memory_cap.h)
  LlmOptions llm;                    // the LLM proposer (off unless llm.url is set); the worker's own
  std::function<void(const std::string&)> progress;   // one line per event (may be empty)
  std::function<void(const SearchProgress&)> on_step; // after every candidate (may be empty)
  const std::atomic<bool>* stop = nullptr;             // asked to stop: persist and return
};
nlohmann::json to_json(const EvolveOptions& o);
// Reads the fields of to_json() (search options included) over `o`: a job's settings. A wrong type
// or an out-of-range value is kInvalid and leaves `o` unchanged.
Status apply_evolve_json(EvolveOptions& o, const nlohmann::json& j);

struct EvolveResult {
  std::string key;
  std::string outcome;               // "served" | "eager_best" | "exists" | "stopped" | "failed" | "skipped"
  std::string why;
  double eager_ms = 0, best_ms = 0;
  int evaluated = 0;                 // candidates evaluated in this run (resumed work excluded)
  nlohmann::json to_json() const;
};

// Runs (or resumes) the search for `key` and writes the outcome to the cache: a "served" record
// with its evidence, or "eager_best". job_file: the job with captured inputs ("" = generated only).
EvolveResult evolve_key(const std::string& key, const std::string& job_file, int device, const EvolveOptions& o);

// Verifies one kernel for a call through a child in "full" mode. call_json: evolve/ops/op_call.h JSON.
// Returns the child's verdict JSON ({"verified": ..., "stage": ..., "stages": [...]}), or an
// infrastructure error (the child could not start).
// The binary a full-mode pass carries back from the evaluation child ("binary", base64), checked
// against the hash its compile stage recorded: kInvalid when absent or when they differ. What
// promotion and `cache put --verify` store, never a build of their own.
Result<std::string> verified_binary(const nlohmann::json& verdict);

Result<nlohmann::json> verify_kernel(const nlohmann::json& call_json, const std::string& source,
                                     const nlohmann::json& launch, int device, const EvolveOptions& o);

// Copies what a passed full-gauntlet verdict established into the record's typed fields (record.h):
// the numerics stage's determinism, and per output the live check's budget, twice the largest
// (budget + eager's own error) over the input sets (candidate-vs-eager error is at most their sum;
// the factor leaves room for real data beyond the generated sets). Leaves `r` unchanged where the
// verdict has no numerics evidence. A candidate not `repeatable` (proposer.h) is recorded "varies"
// whatever its runs showed.
void record_verdict_facts(Record& r, const nlohmann::json& verdict, bool repeatable = true);

// True when `source` with `launch` is the kernel stored in `r` (the worker never promotes the kernel
// of a record the live check disabled). Compares the launch spec as the record holds it, normalised.
bool is_recorded_kernel(const Record& r, const std::string& source, const nlohmann::json& launch);

// What the worker checks before it runs a job: the key names a call we can search and the
// settings validate (apply_evolve_json). The job's options, or why it is rejected.
Result<EvolveOptions> job_options(const EvolveOptions& base, const Job& job);
// read_job (runtime/worker_client.h) + job_options: `kernelcraft job-check` and the fuzz tests use
// exactly the worker's validation.
Result<EvolveOptions> check_job_file(const EvolveOptions& base, const std::string& path);

// The daemon: holds <cache>/worker.lock, runs pending jobs oldest first, exits after idle_exit_s
// without jobs. Returns the process exit code.
int run_worker(const EvolveOptions& o, double idle_exit_s);


}  // namespace kc::evolve
