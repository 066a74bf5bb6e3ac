// CUDA op-family templates: elementwise (unary and unary backward), softmax / log_softmax and
// their backward, layer norm and its backward. A template renders NVRTC source plus a launch spec
// for one call and one knob setting. Sources depend on the op, dtype and knobs only (sizes are
// kernel arguments, register-cached row lengths are rounded to powers of two), so one compiled
// source serves many shapes. Everything is for contiguous, 16-byte aligned tensors
// (OpCall::dense()); math is fp32 with accurate expf/logf/erff/tanhf (no fast math).
//
// Knobs a render does not use for a setting (e.g. "rows" when a block owns a row) are set to
// their canonical value in Candidate::knobs, so two settings that render the same code share an
// id. Knob values outside space() and combinations over the register budget are kUnsupported.
//
// This file is the registry; the families live in
// templates_cuda_<family>.cpp (elementwise, softmax, layer_norm[_backward], ..., cross_entropy[_backward],
// rms_norm[_backward], kl_div: forward and backward in one file)
// and share templates_cuda_common.h.
#include "evolve/propose/proposer.h"

namespace kc::evolve {

const Template* cuda_elementwise_template(bool backward);
const Template* cuda_softmax_template(bool backward);
const Template* cuda_layer_norm_template();
const Template* cuda_layer_norm_backward_template();
const Template* cuda_group_norm_template();
const Template* cuda_batch_norm_template();
const Template* cuda_scan_template();
const Template* cuda_pool_template();
const Template* cuda_reduction_template();
const Template* cuda_pool_global_template();
const Template* cuda_pool_backward_template();
const Template* cuda_loss_template();
const Template* cuda_loss_backward_template();
const Template* cuda_batch_norm_backward_template();
const Template* cuda_group_norm_backward_template();
const Template* cuda_embedding_backward_template();
const Template* cuda_cross_entropy_template();
const Template* cuda_cross_entropy_backward_template();
const Template* cuda_rms_norm_template();
const Template* cuda_rms_norm_backward_template();
const Template* cuda_kl_div_template();
const Template* cuda_kl_div_backward_template();

const std::vector<const Template*>& cuda_templates() {
  static const std::vector<const Template*> v = {
      cuda_elementwise_template(false), cuda_elementwise_template(true), cuda_softmax_template(false),
      cuda_softmax_template(true),      cuda_layer_norm_template(), cuda_layer_norm_backward_template(),
      cuda_group_norm_template(), cuda_batch_norm_template(), cuda_scan_template(), cuda_pool_template(), cuda_reduction_template(),
      cuda_pool_global_template(), cuda_pool_backward_template(),
      cuda_loss_template(), cuda_loss_backward_template(), cuda_batch_norm_backward_template(),
      cuda_group_norm_backward_template(), cuda_embedding_backward_template(), cuda_cross_entropy_template(),
      cuda_cross_entropy_backward_template(), cuda_rms_norm_template(), cuda_rms_norm_backward_template(),
      cuda_kl_div_template(), cuda_kl_div_backward_template()};
  return v;
}

}  // namespace kc::evolve
