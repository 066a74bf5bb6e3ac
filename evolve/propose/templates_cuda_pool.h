// The device sources of the CUDA pooling template (templates_cuda_pool.cpp): the window functions,
// runtime and baked kernels (templates_cuda_pool_kernels.cpp) and the strip kernel
// (templates_cuda_pool_strip.cpp). Internal to evolve/.
#pragma once
#include <string>

namespace kc::evolve::cuda_tpl {

// The device source of the strip kernel (knob `rows` > 1): needs the template's kc_win, kc_take and
// baked window constants before it; KC_ENTRY names its entry.
const char* pool_strip_kernel();

// kc_win, the window of an output along one axis: fixed windows, or adaptive pooling's.
const char* pool_window(bool adaptive);
// The runtime kernel (bake 0): windows, strides, padding and dilation as arguments; needs kc_win.
const char* pool_runtime_kernel();
// kc_take (one tap), kc_count (an average's divisor), kc_span (a register row span) and kc_put
// (the outputs' stores, staged or vector), which the baked and strip kernels share.
std::string pool_baked_helpers();
// The baked kernel (bake 1, one output row a thread): needs kc_win, kc_take, kc_span and the
// baked window constants.
const char* pool_baked_kernel();

}  // namespace kc::evolve::cuda_tpl
