// The worker's shared steps (worker.cpp), for the key search (key_search.cpp) and verify_kernel:
// cache reads and writes outside a long-held lock, the evaluation child's call file, how a verdict
// becomes an Evaluation, the promotion rule and the LLM's turn. Internal to evolve/.
#pragma once
#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

#include "evolve/propose/llm.h"
#include "evolve/ops/op_call.h"
#include "evolve/propose/proposer.h"
#include "evolve/search/search.h"
#include "evolve/worker/worker.h"
#include "runtime/status.h"

namespace kc::evolve {

using Clock = std::chrono::steady_clock;
double secs_since(Clock::time_point t0);
// One value of the cache at `dir`, opened read-only / as the writer for this one access.
Result<std::string> read_value(const std::string& dir, const std::string& key);
Status write_value(const std::string& dir, const std::string& key, const std::string& value);
std::string iso_now();   // UTC, ISO 8601
Evaluation evaluation_of(const Candidate& c, const nlohmann::json& verdict);
// Writes `c` to a new file in this user's temporary directory; returns its path.
std::string temp_call_file(const OpCall& c);
// The promotion decision on a full-mode verdict (timed pair by pair against eager).
bool beats_paired(const nlohmann::json& v, const EvolveOptions& o);
SearchProgress progress_of(const Search& search, double eager_ms);

}  // namespace kc::evolve
