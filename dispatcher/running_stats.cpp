// The running-statistics update of a served batch norm call (running_stats.h).
#include "dispatcher/running_stats.h"

namespace kc::dispatch {

void update_running_stats(const at::Tensor& x, const at::Tensor& running_mean, const at::Tensor& running_var,
                          const at::Tensor& mean, const at::Tensor& invstd, double momentum, double eps) {
  const double n = static_cast<double>(x.numel() / x.size(1));
  // Six small launches over C values, in the statistics' own dtype (fp32, as eager's update).
  at::Tensor var = invstd.pow(-2).sub_(eps);
  running_mean.mul_(1 - momentum).add_(mean, momentum);
  running_var.mul_(1 - momentum).add_(var, momentum * n / (n - 1));
}

}  // namespace kc::dispatch
