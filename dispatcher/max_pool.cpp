// aten::max_pool1d / 2d / 3d (F.max_pool1d/2d/3d and nn.MaxPool1d/2d/3d without return_indices)
// caught above autograd where no gradient is wanted (docs/DESIGN.md "Composites above autograd").
// PyTorch runs them as composites: on CUDA always through max_pool2d/3d_with_indices, writing an
// int64 index beside every value and dropping it. A stride-1 fp32 pool then writes 12 bytes an
// output for 4 it reads; the indices are 2/3 of its traffic, and torch.compile never writes them.
// Here kernelcraft's max_pool2d/3d_values (evolve/ops/pool.h) is served instead: the values alone,
// the same taps in the same order (ties, NaNs and -inf as eager).
//
// PyTorch's composite runs, bit for bit, whenever a gradient is wanted (autograd needs the
// indices: the composite's max_pool*_with_indices is then intercepted as before), the call is not
// a plain eager one (see cross_entropy.cpp: subclasses, fake tensors, dispatch modes, forward AD),
// or the values' key has no kernel. Its inner max_pool*_with_indices then runs under EagerOnly: a
// key that the served values make unreachable is neither recorded nor searched.
#include <ATen/ATen.h>
#include <ATen/ops/max_pool1d_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/max_pool2d_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/max_pool3d_compositeimplicitautograd_dispatch.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <vector>

#include "dispatcher/call.h"
#include "dispatcher/composite.h"

namespace kc::dispatch {
namespace {

// A plain eager call in f32 / bf16 / f16 of an (N, C, spatial) or (C, spatial) input with elements,
// that wants no gradient.
bool eligible(const at::Tensor& x, int nd) {
  if (!no_dispatch_mode() || !x.defined() || !plain_tensor(x, x) || x.numel() == 0) return false;
  if (x.dim() != nd + 1 && x.dim() != nd + 2) return false;
  const at::ScalarType s = x.scalar_type();
  if (s != at::kFloat && s != at::kBFloat16 && s != at::kHalf) return false;
  return !(c10::GradMode::is_enabled() && x.requires_grad());
}

// The scalars as max_pool*_with_indices binds them (its row of ops.def), so the geometry is one.
// (Not named bind: with std::vector arguments, argument-dependent lookup would pick std::bind.)
void bind_pool(Call& c, const at::Tensor& x, at::IntArrayRef k, at::IntArrayRef s, at::IntArrayRef p, at::IntArrayRef d, bool ceil) {
  c.t("self", x);
  c.list("kernel_size", k);
  c.list("stride", s);
  c.list("padding", p);
  c.list("dilation", d);
  c.b("ceil_mode", ceil);
}

template <int ND>
at::Tensor max_pool_kernel(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  auto own = [&] {
    if constexpr (ND == 2) return at::compositeimplicitautograd::max_pool2d(self, kernel_size, stride, padding, dilation, ceil_mode);
    else return at::compositeimplicitautograd::max_pool3d(self, kernel_size, stride, padding, dilation, ceil_mode);
  };
  if (!eligible(self, ND)) return own();
  Call c(ND == 2 ? OpId::kMaxPool2dValues : OpId::kMaxPool3dValues, self.is_cuda() ? Dev::kCuda : Dev::kCpu, self);
  if (!c.active()) return own();
  bind_pool(c, self, kernel_size, stride, padding, dilation, ceil_mode);
  return c.run<at::Tensor>([&] {
    EagerOnly inner;
    return own();
  });
}

// aten::max_pool1d: as the composite runs it on CUDA, a 2d pool over a one-high plane (the window
// [1, k], stride [1, s], padding [0, p], dilation [1, d]), so its key is max_pool2d_values'.
at::Tensor max_pool1d_kernel(const at::Tensor& self, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                             at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode) {
  auto own = [&] { return at::compositeimplicitautograd::max_pool1d(self, kernel_size, stride, padding, dilation, ceil_mode); };
  const auto one = [](at::IntArrayRef v, int64_t dflt) { return v.empty() ? dflt : v[0]; };
  if (!eligible(self, 1) || kernel_size.size() != 1 || stride.size() > 1 || padding.size() != 1 || dilation.size() != 1)
    return own();
  Call c(OpId::kMaxPool2dValues, self.is_cuda() ? Dev::kCuda : Dev::kCpu, self);
  if (!c.active()) return own();
  const at::Tensor x = self.unsqueeze(-2);
  const std::vector<int64_t> k = {1, kernel_size[0]}, s = {1, one(stride, kernel_size[0])}, p = {0, padding[0]},
                             d = {1, dilation[0]};
  bind_pool(c, x, k, s, p, d, ceil_mode);
  return c.run<at::Tensor>([&] {
           EagerOnly inner;
           return own().unsqueeze(-2);
         })
      .squeeze(-2);
}

}  // namespace

void register_max_pool(OpId op) {
  if (op == OpId::kMaxPool2dValues) {
    impl_above_autograd("max_pool2d", TORCH_FN(max_pool_kernel<2>), __FILE__, __LINE__);
    impl_above_autograd("max_pool1d", TORCH_FN(max_pool1d_kernel), __FILE__, __LINE__);
  } else {
    impl_above_autograd("max_pool3d", TORCH_FN(max_pool_kernel<3>), __FILE__, __LINE__);
  }
}

}  // namespace kc::dispatch
