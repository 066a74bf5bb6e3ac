// The error model of the numerics stage (numerics.h attach_tolerance): for each element of a
// reduced output, the magnitude of what was summed into it, computed in fp64 from the inputs,
// turned into the tolerance a correct fp32 implementation meets in any summation order. Lives
// apart from numerics.cpp, which builds the sets and compares against these tolerances.
#include <algorithm>
#include <cmath>

#include "evolve/numerics.h"
#include "runtime/ops.h"

namespace kc::evolve {
namespace {

constexpr int64_t kChunk = kNumericsChunk;
at::Tensor flat(const at::Tensor& t) { return t.reshape(-1); }

}  // namespace

namespace {

// The unit of roundoff a correct implementation works in for output j: the output dtype's
// epsilon, or bf16's / tf32's under those opt-in precision policies (fp32 outputs).
double output_eps(const OpCall& call, size_t j) {
  const DType d = call.outputs[j].dtype;
  if (d == DType::kF32 && call.policy == "bf16") return 3.9e-3;
  if (d == DType::kF32 && call.policy == "tf32") return 4.9e-4;
  return d == DType::kF64 ? 2.2e-16 : d == DType::kF32 ? 1.19e-7 : 7.8e-3;
}

// Always a copy: the model works in place, and an fp64 reference must not be changed through it.
at::Tensor f64(const at::Tensor& t) { return t.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true); }

// Every operand as [rows, k] with the reduced axis last (a view for contiguous tensors reduced
// over their last axis), so the model runs over chunks of rows with fixed temporaries.
at::Tensor as_rows(const at::Tensor& t, int64_t dim, int64_t k) {
  return (t.dim() == 0 ? t.reshape({1}) : t.movedim(dim, -1)).reshape({-1, k});
}
at::Tensor param_of(const at::Tensor& t, int64_t n, double fill, const at::Tensor& like) {
  return t.defined() ? f64(t).reshape({1, n}) : at::full({1, n}, fill, like.options().dtype(at::kDouble));
}

// The operands of one chunk of rows (float or double, [rows, k]; stats [rows, 1]).
struct Chunk {
  std::vector<at::Tensor> in;   // the call's inputs, row views (parameters whole)
  at::Tensor r64;               // output j's fp64 reference, [rows, k] or [rows, 1]
};

// Layer norm forward. The mean sums x: |mean| + g mean|x| (g = sqrt(n)). The variance sums
// (x - mean)^2, positive terms whose inputs are exact to first order (the mean's error enters
// squared): rstd (1 + g var / (var + eps)). The output rounds x - mean (or x rstd w - mean rstd w,
// eager's fused form) and carries the statistics' errors: |y| + (|x| + |mean|) rstd |w| + |b| +
// g rstd |w| (mean|x| + |x - mean|).
at::Tensor layer_norm_scale(const Chunk& c, size_t j, int64_t n, double eps) {
  at::Tensor x = f64(c.in[0]);
  const double g = std::sqrt(static_cast<double>(n));
  at::Tensor mean = x.mean(1, true), mabs = x.abs().mean(1, true);
  if (j == 1) return mean.abs_() + g * mabs;
  at::Tensor d = x - mean;
  at::Tensor var = d.square().mean(1, true), rstd = (var + eps).rsqrt();
  if (j == 2) return rstd * (1 + g * var / (var + eps));
  at::Tensor aw = param_of(c.in[1], n, 1.0, x).abs_(), ab = param_of(c.in[2], n, 0.0, x).abs_();
  at::Tensor h = (x.abs_() + mean.abs()).mul_(rstd).mul_(aw).add_(ab).add_(f64(c.r64).abs_());
  return h.add_(d.abs_().add_(mabs).mul_(rstd).mul_(aw).mul_(g));
}

// Layer norm backward's grad_input, with a = w dy and xhat = (x - mean) rstd from the given
// (float) mean and rstd: x - mean rounds relative to itself, so xhat is exact to a few ulp.
// grad_input = rstd (a - mean(a) - xhat mean(a xhat)): rstd (|a| + g mean|a| + (1 + g) |xhat|
// mean|a xhat|). Eager's form b x + c (b and c from sum(a x)) cancels where |x| >> |x - mean| and
// is outside this on offset rows: the cap holds there.
at::Tensor layer_norm_backward_dx_scale(const Chunk& c, int64_t n) {
  at::Tensor dy = f64(c.in[0]), x = f64(c.in[1]);
  at::Tensor mean = f64(c.in[2]).reshape({-1, 1}), rstd = f64(c.in[3]).reshape({-1, 1});
  const double g = std::sqrt(static_cast<double>(n));
  at::Tensor xh = (x - mean).mul_(rstd).abs_();
  at::Tensor aa = (param_of(c.in[4], n, 1.0, x) * dy).abs_();
  at::Tensor h = xh * (aa * xh).mean(1, true).mul_(1 + g);
  return h.add_(aa.mean(1, true).mul_(g)).add_(aa).mul_(rstd).add_(f64(c.r64).abs_());
}

// Layer norm backward's grad_weight sums dy xhat over the rows (j = 1), grad_bias dy (j = 2):
// this chunk's sum |dy xhat| or sum |dy|, [1, n] (the caller adds |r64| + sqrt(rows) sum).
at::Tensor layer_norm_backward_col_terms(const Chunk& c, size_t j) {
  at::Tensor dy = f64(c.in[0]).abs_();
  if (j == 2) return dy.sum(0, true);
  at::Tensor xh = (f64(c.in[1]) - f64(c.in[2]).reshape({-1, 1})).mul_(f64(c.in[3]).reshape({-1, 1})).abs_();
  return dy.mul_(xh).sum(0, true);
}

// Softmax family, rows [r, k], z = x - max(x): exp(z) rounds z (|z| ulp relative), the sum is of
// positive terms. softmax: y (1 + |z| + g (1 + sum y |z|)); log_softmax: |out| + |x| + |max| +
// |log sum| + g (1 + sum y |z|). Backward: softmax's dy' = y (dy - sum dy y): |dy'| + |y| (|dy| +
// |sum dy y| + g sum |dy y|); log_softmax's dy - exp(out) sum dy: |dy'| + |dy| + exp(out)
// (|sum dy| + g sum |dy|).
at::Tensor softmax_scale(OpId op, const Chunk& c, int64_t k) {
  const double g = std::sqrt(static_cast<double>(k));
  switch (op) {
    case OpId::kSoftmax:
    case OpId::kLogSoftmax: {
      at::Tensor x = f64(c.in[0]), m = x.amax(1, true);
      at::Tensor z = x - m, e = z.exp(), total = e.sum(1, true);
      at::Tensor spread = (e / total).mul_(z.abs()).sum(1, true).add_(1).mul_(g).add_(1);
      if (op == OpId::kSoftmax) return e.div_(total).mul_(z.abs_().add_(spread));
      return x.abs_().add_(m.abs()).add_(total.log().abs_()).add_(spread).add_(f64(c.r64).abs_());
    }
    case OpId::kSoftmaxBackward: {
      at::Tensor dy = f64(c.in[0]), y = f64(c.in[1]).abs_(), p = dy * y;
      at::Tensor h = p.sum(1, true).abs_();
      h.add_(p.abs_().sum(1, true).mul_(g));
      return dy.abs_().add_(h).mul_(y).add_(f64(c.r64).abs_());
    }
    default: {   // log_softmax backward
      at::Tensor dy = f64(c.in[0]), e = f64(c.in[1]).exp_();
      at::Tensor h = dy.sum(1, true).abs_();
      h.add_(dy.abs().sum(1, true).mul_(g));
      return e.mul_(h).add_(dy.abs_()).add_(f64(c.r64).abs_());
    }
  }
}

// How output j of a reduction is laid out in rows: the reduced axis and its length k, and
// whether the output is a per-row statistic ([rows, 1]) or per-column (layer norm backward's
// grad_weight and grad_bias). kUnary families have no layout (no model).
struct RowLayout {
  bool model = false;
  int64_t dim = 0, k = 1;       // the lead input's reduced axis (layer norm: flattened trailing)
  bool stat = false, col = false;
};

RowLayout row_layout(const OpCall& call, const InputSet& s, size_t j) {
  RowLayout l;
  const OpFamily fam = op_info(call.op).family;
  if (fam == OpFamily::kUnary || fam == OpFamily::kUnaryBackward || s.inputs.empty() || !s.inputs[0].defined())
    return l;
  l.model = true;
  if (fam == OpFamily::kSoftmax || fam == OpFamily::kSoftmaxBackward) {
    const int64_t nd = s.inputs[0].dim();
    l.dim = call.int_arg("dim", -1);
    if (l.dim < 0) l.dim += nd;
    l.dim = nd == 0 ? 0 : std::clamp<int64_t>(l.dim, 0, nd - 1);
    l.k = nd == 0 ? 1 : std::max<int64_t>(1, s.inputs[0].size(l.dim));
    return l;
  }
  for (int64_t v : call.list_arg("normalized_shape")) l.k *= std::max<int64_t>(1, v);
  l.dim = -1;
  l.stat = fam == OpFamily::kLayerNorm && j > 0;
  l.col = fam == OpFamily::kLayerNormBackward && j > 0;
  return l;
}

// The condition magnitude H of output j (attach_tolerance) in fp64, chunk by chunk of rows:
// sink(r0, rows, h) with h [rows, k] (stat: [rows, 1]) in the output's row layout; a per-column
// output (col) is summed over all rows first and given as one [1, k] chunk.
template <class Sink>
void for_each_scale(const OpCall& call, const InputSet& s, size_t j, const RowLayout& l, Sink sink) {
  const OpFamily fam = op_info(call.op).family;
  const bool ln = fam == OpFamily::kLayerNorm, lnb = fam == OpFamily::kLayerNormBackward;
  // Per-row operands as [rows, k] (layer norm flattens its normalized dims; its saved mean and
  // rstd are [rows, 1]); parameters (weight, bias) stay whole.
  std::vector<at::Tensor> rows(s.inputs.size());
  std::vector<bool> sliced(s.inputs.size(), false);
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const at::Tensor& t = s.inputs[k];
    rows[k] = t;
    if (!t.defined()) continue;
    if (ln && k == 0) rows[k] = t.reshape({-1, l.k});
    else if (lnb && k < 2) rows[k] = t.reshape({-1, l.k});
    else if (lnb && k < 4) rows[k] = t.reshape({-1, 1});
    else if (!ln && !lnb) rows[k] = as_rows(t, l.dim, l.k);
    sliced[k] = (ln && k == 0) || (lnb && k < 4) || (!ln && !lnb);
  }
  const at::Tensor& o = s.ref64[j];
  at::Tensor r64 = l.col ? o.reshape({1, l.k}) : l.stat ? o.reshape({-1, 1}) : (ln || lnb) ? o.reshape({-1, l.k})
                                                                                           : as_rows(o, l.dim, l.k);
  const int64_t nrows = rows[0].size(0);
  at::Tensor h = l.col ? at::zeros({1, l.k}, r64.options().dtype(at::kDouble)) : at::Tensor();
  const int64_t step = std::max<int64_t>(1, kChunk / l.k);
  for (int64_t r0 = 0; r0 < nrows; r0 += step) {
    const int64_t len = std::min(step, nrows - r0);
    Chunk c;
    for (size_t k = 0; k < rows.size(); ++k) c.in.push_back(sliced[k] ? rows[k].narrow(0, r0, len) : rows[k]);
    c.r64 = l.col ? r64 : r64.narrow(0, r0, len);
    // NaN from non-finite inputs: no model there (the floor, 16 ulp of |r64| + tau, still holds).
    if (l.col) h.add_(layer_norm_backward_col_terms(c, j));
    else if (ln) sink(r0, len, layer_norm_scale(c, j, l.k, call.double_arg("eps", 1e-5)).nan_to_num_(0.0, INFINITY));
    else if (lnb) sink(r0, len, layer_norm_backward_dx_scale(c, l.k).nan_to_num_(0.0, INFINITY));
    else sink(r0, len, softmax_scale(call.op, c, l.k).nan_to_num_(0.0, INFINITY));
  }
  if (l.col) sink(0, 1, h.mul_(std::sqrt(static_cast<double>(nrows))).add_(f64(r64).abs_()).nan_to_num_(0.0, INFINITY));
}

// One chunk of the tolerance: scale = |r64| + tau, h the model (undefined: elementwise).
at::Tensor tolerance_of(const at::Tensor& r64, const at::Tensor& h, double u, double tau, double eager) {
  at::Tensor scale = f64(r64).abs_().add_(tau);
  at::Tensor tol = scale * std::max(4 * eager, 16 * u);
  // Elementwise ops round exact inputs once through a function approximation: eager's own error
  // (<= ~32 ulp in the mixed measure, gelu) is the evidence of what fp32 achieves; no cap.
  if (!h.defined()) return tol;
  at::Tensor lo = at::maximum(scale.mul_(16 * u), h * kModelFloor * u);
  return at::minimum(at::maximum(tol, lo), at::maximum(lo, h.mul(kModelCap * u)));
}

}  // namespace

void attach_tolerance(const OpCall& call, InputSet& s) {
  const size_t outs = s.ref64.size();
  s.tol.assign(outs, at::Tensor());
  s.budget.assign(outs, 0.0);
  s.eager_ratio.assign(outs, 0.0);
  s.worst.assign(outs, 0.0);
  for (size_t j = 0; j < outs && j < call.outputs.size() && j < s.tau.size(); ++j) {
    const at::Tensor& r64 = s.ref64[j];
    if (!r64.defined()) continue;
    const double u = output_eps(call, j), tau = s.tau[j], eager = j < s.eager_err.size() ? s.eager_err[j] : 0;
    const RowLayout l = row_layout(call, s, j);
    at::Tensor tol = at::empty(r64.sizes(), r64.options().dtype(at::kFloat));
    at::Tensor tf = flat(tol), rf = flat(r64), ef = flat(s.ref[j]);
    double budget = 0, ratio = 0;
    // The tolerance of flat elements [off, off + len) from h (undefined: no model), into tol.
    auto apply = [&](int64_t off, int64_t len, const at::Tensor& h) {
      at::Tensor r = rf.narrow(0, off, len), e = ef.narrow(0, off, len);
      at::Tensor t = tolerance_of(r, h, u, tau, eager);
      at::Tensor fin = at::isfinite(r), both = fin & at::isfinite(e);
      budget = std::max(budget, (t / r.abs().add_(tau)).masked_fill_(fin.logical_not(), 0).max().item<double>());
      ratio = std::max(ratio, (f64(e) - r).abs_().div_(t).masked_fill_(both.logical_not(), 0).max().item<double>());
      tf.narrow(0, off, len).copy_(t);
    };
    const OpFamily fam = op_info(call.op).family;
    const bool moved = (fam == OpFamily::kSoftmax || fam == OpFamily::kSoftmaxBackward) && r64.dim() > 1 &&
                       l.dim != r64.dim() - 1;
    if (!l.model) {
      for (int64_t off = 0; off < rf.numel(); off += kChunk) apply(off, std::min(kChunk, rf.numel() - off), at::Tensor());
    } else if (!moved) {   // row layout is the flat order: chunk by chunk, no output-sized fp64
      const int64_t width = l.stat ? 1 : l.k;
      for_each_scale(call, s, j, l, [&](int64_t r0, int64_t rows, const at::Tensor& h) {
        apply(r0 * width, rows * width, h.reshape(-1));
      });
    } else {   // reduced over a leading axis: the model whole, then back in the output's order
      std::vector<int64_t> sizes = r64.movedim(l.dim, -1).sizes().vec();
      at::Tensor h = at::empty({rf.numel() / l.k, l.k}, r64.options().dtype(at::kDouble));
      for_each_scale(call, s, j, l, [&](int64_t r0, int64_t rows, const at::Tensor& c) { h.narrow(0, r0, rows).copy_(c); });
      h = h.view(sizes).movedim(-1, l.dim).contiguous().view(-1);
      apply(0, rf.numel(), h);
    }
    s.tol[j] = tol;
    s.budget[j] = budget;
    s.eager_ratio[j] = ratio;
  }
}

}  // namespace kc::evolve
