// cudnn_batch_norm, where eager PyTorch sends fp32 (and fp16 with fp32 parameters) training batch
// norm on CUDA, served under native_batch_norm's key. In training its first three outputs are
// native_batch_norm's (output, save_mean, save_invstd: cuDNN's saved "inverse variance" is
// 1/sqrt(var + eps)) and the fourth is a workspace for cudnn_batch_norm_backward that plain batch
// norm leaves empty: checked on the H200 (torch 2.11, cuDNN 9.19) for 3d/4d/5d, odd sizes and
// channels_last, where every reserve came back with 0 bytes and the backward gave the same
// gradients with an empty or a junk one. Eval calls stay cuDNN's (their saved outputs are empty,
// unlike native_batch_norm's), and one non-empty reserve seen from cuDNN in this process (a cuDNN
// that needs it) stops the serving for good, with one log line.
// cudnn_batch_norm_backward, where autograd sends the backward of such a forward, is served under
// native_batch_norm_backward's training key in the same way: cuDNN's save_var is the forward's
// invstd, the mask is all three gradients, and a non-empty reserve leaves the call to cuDNN.
#include <atomic>

#include <ATen/ATen.h>
#include <ATen/CUDAFunctions.h>
#include <torch/library.h>

#include "dispatcher/intercept.h"
#include "dispatcher/registry.h"
#include "runtime/log.h"

namespace kc::dispatch {
namespace {

using Out4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Out3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Native = Intercept<OpId::kBatchNorm, Dev::kCuda, &at::cuda::native_batch_norm>;
using NativeBackward = Intercept<OpId::kBatchNormBackward, Dev::kCuda, &at::cuda::native_batch_norm_backward>;

std::atomic<bool> g_reserve_used{false};

Out4 cudnn_batch_norm(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                      const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv, bool training,
                      double factor, double eps) {
  auto cudnn = [&] { return at::cuda::cudnn_batch_norm(x, w, b, rm, rv, training, factor, eps); };
  if (!training || g_reserve_used.load(std::memory_order_relaxed)) return cudnn();
  at::Tensor reserve;
  auto eager = [&] {
    auto [y, mean, invstd, r] = cudnn();
    if (r.numel() != 0 && !g_reserve_used.exchange(true))
      log(LogLevel::kWarn, "cudnn_batch_norm returned a " + std::to_string(r.numel()) +
                               "-byte reserve: its calls are no longer served in this process");
    reserve = r;
    return std::make_tuple(y, mean, invstd);
  };
  auto [y, mean, invstd] = Native::call_with(eager, x, std::optional<at::Tensor>(w), b, rm, rv, training, factor, eps);
  if (!reserve.defined()) reserve = at::empty({0}, x.options().dtype(at::kByte));   // a kernel answered
  return {std::move(y), std::move(mean), std::move(invstd), std::move(reserve)};
}

Out3 cudnn_batch_norm_backward(const at::Tensor& x, const at::Tensor& gy, const at::Tensor& w,
                               const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv,
                               const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_var,
                               double eps, const at::Tensor& reserve) {
  auto cudnn = [&] { return at::cuda::cudnn_batch_norm_backward(x, gy, w, rm, rv, save_mean, save_var, eps, reserve); };
  if (reserve.numel() != 0 || g_reserve_used.load(std::memory_order_relaxed)) return cudnn();
  return NativeBackward::call_with(cudnn, gy, x, std::optional<at::Tensor>(w), rm, rv, save_mean, save_var, true, eps,
                                   std::array<bool, 3>{true, true, true});
}

}  // namespace

bool register_cudnn_batch_norm(torch::Library& lib, OpId op) {
  if (op == OpId::kBatchNorm) lib.impl("cudnn_batch_norm", TORCH_FN(cudnn_batch_norm));
  if (op == OpId::kBatchNormBackward) lib.impl("cudnn_batch_norm_backward", TORCH_FN(cudnn_batch_norm_backward));
  return true;
}

}  // namespace kc::dispatch
