// The float-atomic variant of the CUDA embedding backward template
// (templates_cuda_embedding_backward.cpp), in a file of its own
// (templates_cuda_embedding_backward_atomic.cpp). Internal to evolve/.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

namespace kc::evolve::cuda_tpl {

// Its device source: needs the dtype prelude and the template's constants (VEC, RPB, IT) before it.
const char* ebw_atomic_body();
// Its two launches (zero the table, then the atomic adds) for `vec` elements a load and `rows`
// warps a block; it needs no scratch.
nlohmann::json ebw_atomic_launches(int64_t vec, int64_t rows);

}  // namespace kc::evolve::cuda_tpl
