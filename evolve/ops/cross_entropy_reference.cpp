// Cross-entropy forward and backward, torch half: eager references (at::cross_entropy_loss and
// its autograd: the composite kernelcraft replaces), the inputs (class targets, probabilities,
// weights, and the backward's lse made by the forward: the pair is verified as it runs in
// training) and the error model of the forward.
#include "evolve/ops/reference.h"
#include <c10/core/GradMode.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>

#include "evolve/ops/cross_entropy.h"

namespace kc::evolve {
namespace {

// No "special": a mean or sum over inf and nan is not an elementwise answer.
const std::vector<std::string> kCrossEntropyKinds = {"normal", "large", "offset", "extreme"};

// With upcast the user's call ran under CUDA autocast, and eager is the composite under it: the
// composite asks log_softmax for the logits' own dtype (so bf16 log-probabilities), nll_loss is
// in autocast's fp32 list (an fp32 loss). fp64 inputs (run_fp64) are never cast. The dispatcher's
// eager of the backward key does the same (dispatcher/cross_entropy.cpp).
struct CudaAutocast {
  explicit CudaAutocast(bool on) : on_(on), was_(at::autocast::is_autocast_enabled(at::kCUDA)) {
    if (on_) at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  ~CudaAutocast() {
    if (!on_) return;
    at::autocast::set_autocast_enabled(at::kCUDA, was_);
    if (!was_) at::autocast::clear_cache();
  }
  bool on_, was_;
};

at::Tensor lse_of(const at::Tensor& x) {
  return at::logsumexp(x.scalar_type() == at::kDouble ? x : x.to(at::kFloat), {-1});
}

at::Tensor loss_of(const OpCall& c, const CrossEntropyGeom& g, const at::Tensor& x, const std::vector<at::Tensor>& in,
                   size_t first) {
  const CudaAutocast autocast(g.upcast && x.is_cuda());
  at::Tensor loss = at::cross_entropy_loss(x, in[first + 1], opt(in[first + 2]), c.int_arg("reduction", 1),
                                           g.ignore_index, g.label_smoothing);
  // Under autocast the result is fp32 (nll_loss's policy); an fp64 reference stays fp64.
  return g.upcast && loss.scalar_type() != at::kDouble ? loss.to(at::kFloat) : loss;
}

std::vector<at::Tensor> ce_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto g = cross_entropy_geometry(c);
  if (!g.is_ok()) return {};
  return {loss_of(c, g.value(), in[0], in, 0), lse_of(in[0])};
}

// grad_self by eager's own autograd through the composite, cast back to self's dtype as
// autocast's cast does.
std::vector<at::Tensor> ce_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto g = cross_entropy_geometry(c);
  if (!g.is_ok()) return {};
  c10::AutoGradMode grad_on(true);
  at::Tensor leaf = in[1].detach().requires_grad_(true);
  at::Tensor loss = loss_of(c, g.value(), leaf, in, 1);
  auto grads = torch::autograd::grad({loss}, {leaf}, {in[0].to(loss.scalar_type())});
  return {grads[0].to(in[1].scalar_type())};
}

// The user's eager: the composite's loss alone (no lse), and its backward without the forward
// it recomputes above.
at::Tensor ce_forward(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto g = cross_entropy_geometry(c);
  return g.is_ok() ? loss_of(c, g.value(), in[0], in, 0) : at::Tensor();
}
void ce_timed(const OpCall& c, const std::vector<at::Tensor>& in) { ce_forward(c, in); }
void ce_backward_timed(const OpCall& c, const std::vector<at::Tensor>& in) {
  if (cross_entropy_geometry(c).is_ok()) backward_only({in[1], in[2], in[3]}, {true, false, false}, in[0], &ce_forward, c);
}

// Targets: the drawn integers mod C with about one in eight ignore_index; probabilities: a
// softmax of the drawn values (soft labels are distributions; signed "probabilities" would test
// only cancellation); class weights non-negative.
void derive_forward(const CrossEntropyGeom& g, at::Tensor& target, at::Tensor& weight) {
  if (g.probs) {
    target.copy_(at::softmax(target.to(at::kFloat), -1));
  } else {
    at::Tensor raw = target.to(at::kLong);
    at::Tensor cls = raw.remainder(g.classes);
    target.copy_(at::where(raw.div(g.classes, "floor").remainder(8).eq(0), at::full_like(cls, g.ignore_index), cls));
  }
  if (weight.defined()) weight.abs_();
}

void ce_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  auto g = cross_entropy_geometry(c);
  if (g.is_ok()) derive_forward(g.value(), in[1], in[2]);
}

// The forward's inputs as the forward draws them, and lse as the forward computes it.
void ce_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  auto g = cross_entropy_geometry(c);
  if (!g.is_ok()) return;
  derive_forward(g.value(), in[2], in[3]);
  in[4].copy_(lse_of(in[1]));
}

// ---- the forward's error model (fp64, from the inputs) -----------------------------------------
// lse = m + log S: H_lse = |lse| + |m| + |log S| + g_C (1 + sum_j y_j |x_j - m|) (softmax's terms,
// y = exp(x - lse)). A row's term: the class part (1 - e) |w_t| (H_lse + |x_t| + |lse - x_t|), the
// smoothing part (e / C) (|W| H_lse + g_C sum |w x| + |lse W| + |sum w x|), probabilities
// |Q| H_lse + g_C sum |w q x| + |lse Q| + |sum w q x|; plus |term|. The reductions as nll's
// (loss_reference.cpp): sum g_N sum |term| + sum h + |y|; mean over D with D's own error.
struct RowModel {
  at::Tensor lse_h, term, h, wt;   // per row [rows, 1]: lse's magnitude, term, its magnitude, its weight in D
};

// The model of rows [r0, r0 + n) (x: those rows of self; probs: of the target).
RowModel row_model(const CrossEntropyGeom& g, const std::vector<at::Tensor>& in, int64_t r0, int64_t n) {
  const at::Tensor x = f64(in[0].reshape({g.rows, g.classes}).narrow(0, r0, n));
  const double gc = std::sqrt(static_cast<double>(g.classes)), e = g.label_smoothing, C = static_cast<double>(g.classes);
  at::Tensor m = x.amax(1, true), z = x - m, S = z.exp().sum(1, true), lse = m + S.log();
  at::Tensor y = (x - lse).exp_();
  at::Tensor lse_h = lse.abs() + m.abs() + S.log().abs() + y.mul_(z.abs_()).sum(1, true).add_(1).mul_(gc);
  at::Tensor w = in[2].defined() ? f64(in[2]).reshape({1, g.classes}) : at::ones({1, g.classes}, x.options());
  RowModel r;
  if (g.probs) {
    at::Tensor q = f64(in[1].reshape({g.rows, g.classes}).narrow(0, r0, n)).mul_(1 - e).add_(e / C).mul_(w);
    at::Tensor Q = q.sum(1, true), qx = q.mul_(x), sqx = qx.sum(1, true);
    r.term = lse * Q - sqx;
    r.h = Q.abs() * lse_h + qx.abs_().sum(1, true).mul_(gc) + (lse * Q).abs() + sqx.abs();
    r.wt = at::ones_like(Q);
  } else {
    at::Tensor t = in[1].to(at::kLong).reshape({g.rows, 1}).narrow(0, r0, n);
    at::Tensor ignored = t.eq(g.ignore_index), idx = t.clamp(0, g.classes - 1);
    at::Tensor xt = x.gather(1, idx), wt = w.expand({n, g.classes}).gather(1, idx).masked_fill(ignored, 0);
    at::Tensor W = w.sum(), wxs = w * x, wx = wxs.sum(1, true);
    r.term = (1 - e) * wt * (lse - xt) + (e / C) * (lse * W - wx).masked_fill(ignored, 0);
    at::Tensor hs = (W.abs() * lse_h + wxs.abs_().sum(1, true).mul_(gc) + (lse * W).abs() + wx.abs()).mul_(e / C);
    r.h = (1 - e) * wt.abs() * (lse_h + xt.abs() + (lse - xt).abs()) + hs.masked_fill(ignored, 0);
    r.wt = wt;
  }
  r.h.add_(r.term.abs());
  r.lse_h = lse_h;
  return r;
}

// The whole call's per-row model, a chunk of rows at a time: fp64 temporaries stay bounded for a
// 128k vocabulary.
RowModel rows_model(const CrossEntropyGeom& g, const std::vector<at::Tensor>& in) {
  const int64_t step = std::max<int64_t>(1, (int64_t{1} << 22) / g.classes);
  std::vector<at::Tensor> lse_h, term, h, wt;
  for (int64_t r0 = 0; r0 < g.rows; r0 += step) {
    RowModel m = row_model(g, in, r0, std::min(step, g.rows - r0));
    lse_h.push_back(m.lse_h);
    term.push_back(m.term);
    h.push_back(m.h);
    wt.push_back(m.wt);
  }
  return {at::cat(lse_h), at::cat(term), at::cat(h), at::cat(wt)};
}

at::Tensor ce_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t j) {
  auto gr = cross_entropy_geometry(c);
  const at::TensorOptions o = in[0].options().dtype(at::kDouble);
  if (!gr.is_ok()) return at::zeros(c.outputs[j].sizes, o);
  const CrossEntropyGeom& g = gr.value();
  const RowModel r = rows_model(g, in);
  if (j == 1) return r.lse_h.reshape(c.outputs[1].sizes);
  if (g.per_row() || g.one_d) return r.h.reshape(c.outputs[0].sizes);
  const double gn = std::sqrt(static_cast<double>(g.rows));
  const at::Tensor V = r.term.sum(), E = r.term.abs().sum().mul_(gn).add_(r.h.sum());
  if (g.reduction == LossReduction::kSum) return E.add_(V.abs());
  const at::Tensor D = r.wt.sum(), y = (V / D).abs_();
  const at::Tensor Dg = g.probs ? at::zeros({}, o) : r.wt.abs().sum().mul_(gn);
  return E.add_(y * Dg).div_(D.abs()).add_(y);
}

// Rounded once from fp32 (the fused forward's only correct form), as one reduction. Under
// upcast eager's loss is fp32 computed from log-probabilities in the logits' dtype, so that
// dtype's precision is the loss's (lse is computed in fp32 by both: fp32's).
RowLayout ce_layout(const OpCall& c, const std::vector<at::Tensor>&, size_t j) {
  RowLayout l;
  l.model = true;
  l.rounds_once = true;
  auto g = cross_entropy_geometry(c);
  if (j == 0 && g.is_ok() && g->upcast && g->dt != DType::kF32) l.precision = g->dt;
  return l;
}
RowView ce_view(size_t) { return RowView::kWhole; }

}  // namespace

extern const FamilyReference kCrossEntropyReference{&ce_eager, &kCrossEntropyKinds, 1e3, 3.0, &ce_derive,
                                                    &ce_layout, &ce_view, nullptr, false, &ce_whole, &ce_timed};
// The backward is elementwise given lse (a row's grad is P_j times two per-row constants, minus a
// weight): eager's evidence, as the other backward losses.
extern const FamilyReference kCrossEntropyBackwardReference{&ce_backward_eager, &kCrossEntropyKinds, 1e3, 3.0,
                                                            &ce_backward_derive, nullptr, nullptr, nullptr, false,
                                                            nullptr, &ce_backward_timed};

}  // namespace kc::evolve
