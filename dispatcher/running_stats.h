// Batch norm in training with running statistics updates two of its inputs in place, which no
// kernel contract allows (a served kernel only writes its outputs). Such a call is keyed, served
// and verified as the same call without running statistics: its outputs (output, save_mean,
// save_invstd) are the same, bit for bit, with and without them (checked on the H200 for
// native_batch_norm and cudnn_batch_norm, torch 2.11 + cuDNN 9.19, and on the CPU). When a kernel
// answered, update_running_stats does eager's update from its outputs; when eager answered, eager
// ran with the statistics and updated them itself.
#pragma once
#include <optional>

#include <ATen/ATen.h>

#include "runtime/ops.h"

namespace kc::dispatch {

// The operators served this way; each has eager's argument order (input, weight, bias,
// running_mean, running_var, training, momentum, eps).
template <OpId Op> constexpr bool kUpdatesRunningStats = Op == OpId::kBatchNorm;

// Batch norm backward in training reads the saved statistics and never the running ones (ATen's
// CPU and CUDA kernels), so such a call is keyed without them: one key whether or not the module
// tracks them, the same key from native_batch_norm_backward and cudnn_batch_norm_backward. Eager
// still gets the call as made. Argument order: grad_out, input, weight, running_mean, running_var,
// save_mean, save_invstd, train, eps, output_mask.
template <OpId Op> constexpr bool kTrainingIgnoresRunningStats = Op == OpId::kBatchNormBackward;

// True for a training call with both running statistics and more than one value per channel
// (with one, eager's unbiased variance divides by zero: leave that to eager).
template <class W, class B>
bool running_stats_form(const at::Tensor& x, const W&, const B&, const std::optional<at::Tensor>& rm,
                        const std::optional<at::Tensor>& rv, bool training, double, double) {
  if (!training || !rm || !rm->defined() || !rv || !rv->defined() || x.dim() < 2 || x.size(1) == 0) return false;
  return x.numel() / x.size(1) > 1;
}

// Eager's update from a served call's saved statistics, with n = values per channel:
//   running_mean = (1 - momentum) running_mean + momentum mean
//   running_var  = (1 - momentum) running_var  + momentum var n / (n - 1),  var = invstd^-2 - eps.
// The batch variance comes back from invstd = 1/sqrt(var + eps) with a relative error of a few
// float ulps times (1 + eps/var): at var << eps (a constant channel) that is an absolute error
// of about 1e-7 eps, far below anything running statistics are used for.
void update_running_stats(const at::Tensor& x, const at::Tensor& running_mean, const at::Tensor& running_var,
                          const at::Tensor& mean, const at::Tensor& invstd, double momentum, double eps);

}  // namespace kc::dispatch
