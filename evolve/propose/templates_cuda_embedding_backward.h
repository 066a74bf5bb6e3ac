// The float-atomic variant of the CUDA embedding backward template
// (templates_cuda_embedding_backward.cpp), in a file of its own
// (templates_cuda_embedding_backward_atomic.cpp). Internal to evolve/.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace kc::evolve::cuda_tpl {

// Its device source, adding in vectors (sm_90's float2 / float4 atomics) or element by element:
// needs the dtype prelude and the template's constants (VEC, RPB, IT) before it.
std::string ebw_atomic_body(bool vectors);
// Its two launches (zero the table, then the atomic adds) for `vec` elements a load and `rows`
// warps a block; it needs no scratch.
nlohmann::json ebw_atomic_launches(int64_t vec, int64_t rows);

}  // namespace kc::evolve::cuda_tpl
