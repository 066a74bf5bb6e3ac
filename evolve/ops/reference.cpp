// The family table, torch half: each KC_FAMILY row of runtime/ops.def names its reference
// k<Family>Reference, defined in that family's <family>_reference.cpp.
#include "evolve/ops/reference.h"

#include <algorithm>
#include <array>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

namespace kc::evolve {

#define KC_FAMILY(f, name) extern const FamilyReference k##f##Reference;
#include "runtime/ops.def"
#undef KC_FAMILY

const FamilyReference& family_reference(OpFamily f) {
  static const std::array<const FamilyReference*, kNumFamilies> table = {
#define KC_FAMILY(f, name) &k##f##Reference,
#include "runtime/ops.def"
#undef KC_FAMILY
  };
  return *table[static_cast<int>(f)];
}

RowLayout dim_layout(const OpCall& c, const std::vector<at::Tensor>& in, size_t) {
  RowLayout l;
  l.model = true;
  const int64_t nd = in[0].dim();
  l.dim = c.int_arg("dim", -1);
  if (l.dim < 0) l.dim += nd;
  l.dim = nd == 0 ? 0 : std::clamp<int64_t>(l.dim, 0, nd - 1);
  l.k = nd == 0 ? 1 : std::max<int64_t>(1, in[0].size(l.dim));
  return l;
}

void backward_only(const std::vector<at::Tensor>& leaves, const std::vector<bool>& wanted, const at::Tensor& grad,
                   at::Tensor (*forward)(const OpCall&, const std::vector<at::Tensor>&), const OpCall& c) {
  // One retained graph per thread: the timing loop calls this with the same tensors each time.
  struct Kept {
    std::vector<const void*> ptrs;
    std::vector<at::Tensor> leaves;
    at::Tensor out;
  };
  thread_local Kept kept;
  std::vector<const void*> ptrs{grad.data_ptr()};
  for (const auto& t : leaves) ptrs.push_back(t.defined() ? t.data_ptr() : nullptr);
  c10::AutoGradMode grad_on(true);
  if (ptrs != kept.ptrs || !kept.out.defined()) {
    kept = Kept{};
    for (size_t i = 0; i < leaves.size(); ++i)
      kept.leaves.push_back(leaves[i].defined() ? leaves[i].detach().requires_grad_(wanted[i]) : at::Tensor());
    kept.out = forward(c, kept.leaves);
    kept.ptrs = ptrs;
  }
  std::vector<at::Tensor> wrt;
  for (size_t i = 0; i < leaves.size(); ++i)
    if (wanted[i] && kept.leaves[i].defined()) wrt.push_back(kept.leaves[i]);
  torch::autograd::grad({kept.out}, wrt, {grad.to(kept.out.scalar_type())}, /*retain_graph=*/true);
}

}  // namespace kc::evolve
