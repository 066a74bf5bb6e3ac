// Embedding backward, torch half: the eager reference, indices a training batch would hold (the
// drawn integers made rows of the table, with hot rows repeated and padding_idx present), and the
// error model of each output row, a sum of the grad rows whose index is that row.
#include "evolve/ops/reference.h"

#include <algorithm>

namespace kc::evolve {
namespace {

const std::vector<std::string> kEmbeddingKinds = {"normal", "large", "offset", "extreme"};

int64_t num_weights(const OpCall& c) { return c.int_arg("num_weights", 1); }
int64_t padding(const OpCall& c) { return c.int_arg("padding_idx", -1); }
bool scaled(const OpCall& c) { return c.int_arg("scale_grad_by_freq", 0) != 0; }

std::vector<at::Tensor> embedding_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  return {at::embedding_dense_backward(in[0], in[1], num_weights(c), padding(c), scaled(c))};
}

// From a drawn r: one in eight is padding_idx (where it names a row), three in eight one of the
// first four rows (buckets of hundreds of positions, the case a per-row sum must order), the rest
// any row. Every index is valid: eager's answer to one out of range is an error or undefined.
void embedding_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  const int64_t W = num_weights(c), pad = padding(c);
  if (W <= 0 || in[1].numel() == 0) return;
  at::Tensor r = in[1].to(at::kLong), hi = r.div(8, "floor");
  at::Tensor sel = r.remainder(8);
  at::Tensor idx = at::where(sel.ge(1).logical_and(sel.le(3)), hi.remainder(std::min<int64_t>(W, 4)), hi.remainder(W));
  if (pad >= 0 && pad < W) idx = at::where(sel.eq(0), at::full_like(idx, pad), idx);
  in[1].copy_(idx);
}

// Row w sums the c_w grad rows whose index is w (none for padding_idx) in fp32, in any order:
// about sqrt(c_w) ulp of S_w = sum |g| (the reductions' model), so h = sqrt(c_w) S_w + |y|; with
// scale_grad_by_freq the terms are divided by c_w (one rounding each, or one of the sum):
// (sqrt(c_w) + 1) S_w / c_w + |y|. Rows nothing reaches are exactly zero.
at::Tensor embedding_backward_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t) {
  const int64_t W = num_weights(c), pad = padding(c), D = in[0].size(-1), n = in[1].numel();
  const at::TensorOptions o = in[0].options().dtype(at::kDouble);
  at::Tensor idx = in[1].to(at::kLong).reshape({n}), g = f64(in[0]).reshape({n, D});
  at::Tensor valid = idx.ne(pad).logical_and_(idx.ge(0)).logical_and_(idx.lt(W));
  at::Tensor iv = idx.masked_select(valid), gv = g.index({valid});
  at::Tensor S = at::zeros({W, D}, o).index_add_(0, iv, gv.abs());
  at::Tensor y = at::zeros({W, D}, o).index_add_(0, iv, gv);
  at::Tensor cnt = at::zeros({W}, o).index_add_(0, iv, at::ones({iv.numel()}, o)).unsqueeze(1);
  if (!scaled(c)) return S.mul_(cnt.sqrt()).add_(y.abs());
  at::Tensor cn = cnt.clamp_min(1.0);
  return S.mul_(cnt.sqrt().add_(1)).div_(cn).add_(y.div_(cn).abs_());
}

// A reduction (numerics treats it as one); the model itself is embedding_backward_whole. CUDA
// eager sums in fp32 and rounds once to a half output.
RowLayout embedding_backward_layout(const OpCall&, const std::vector<at::Tensor>&, size_t) {
  RowLayout l;
  l.model = true;
  l.rounds_once = true;
  return l;
}
RowView embedding_backward_view(size_t) { return RowView::kWhole; }

}  // namespace

extern const FamilyReference kEmbeddingBackwardReference{
    &embedding_backward_eager, &kEmbeddingKinds, 1e3, 3.0, &embedding_backward_derive,
    &embedding_backward_layout, &embedding_backward_view, nullptr, false, &embedding_backward_whole};

}  // namespace kc::evolve
