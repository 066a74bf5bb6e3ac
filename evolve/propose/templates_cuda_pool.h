// The strip kernel of the CUDA pooling template (templates_cuda_pool.cpp), in a file of its own
// (templates_cuda_pool_strip.cpp). Internal to evolve/.
#pragma once

namespace kc::evolve::cuda_tpl {

// The device source of the strip kernel (knob `rows` > 1): needs the template's kc_win, kc_take and
// baked window constants before it; KC_ENTRY names its entry.
const char* pool_strip_kernel();

}  // namespace kc::evolve::cuda_tpl
