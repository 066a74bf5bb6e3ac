// The device source of the CUDA group norm template (templates_cuda_group_norm.cpp). Internal
// to evolve/.
#pragma once

namespace kc::evolve::cuda_tpl {

// kc_group_norm (a row a group of threads), kc_group_norm_part / kc_group_norm_apply (the split)
// and kc_group_norm_fused (a cluster a row): needs the row constants, KA, RI, CL, the types and
// kGroupHelpers before it.
const char* group_norm_kernels();

}  // namespace kc::evolve::cuda_tpl
