// The serving path's only link to evolution: "submit a job" (docs/DESIGN.md). A first miss
// hands the key and a copy of the call's inputs to a background thread of this process, which
// writes the job file and makes sure a worker serves the cache. Nothing here blocks the caller
// beyond cloning the inputs on the current stream, throws, or runs candidate code.
#pragma once
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace kc::dispatch {

// inputs: the call's tensor arguments in schema order (undefined for absent optionals).
void request_evolution(const std::string& key, bool cuda, int device, const std::vector<const at::Tensor*>& inputs);

// Blocks until every job this process submitted has ended (the worker wrote served or eager_best)
// or `timeout_s` passes; restarts a dead worker meanwhile. True if nothing is pending. Afterwards
// the in-memory table forgets its misses so the next calls see the new kernels.
bool wait_for_evolution(double timeout_s);

// {"submitted": n, "pending": n, "worker_alive": bool, "worker": path, "last_error": "..."}
nlohmann::json evolution_status();

}  // namespace kc::dispatch
