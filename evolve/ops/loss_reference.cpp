// Losses and their backward, torch half: eager references, the inputs each loss accepts (derived
// from the drawn ones) and the error model. Forward: computed over the whole call (`whole`): one
// condition magnitude per term, then either elementwise (reduction none) or one reduced scalar
// (mean, sum). Backward: elementwise given grad_output (a few roundings per element, no
// reduction; smooth_l1's and huber's a branch on d = self - target, continuous at |d| = beta or
// delta, so a d that rounds across it moves the result by about an ulp; beta 0's jump is at d = 0,
// which no rounding crosses), so eager's evidence, as the other elementwise families.
#include "evolve/ops/reference.h"

#include <algorithm>
#include <cmath>

#include <ATen/ExpandUtils.h>

#include "evolve/ops/loss.h"

namespace kc::evolve {
namespace {

// No "special": a mean or sum over inf and nan is not an elementwise answer.
const std::vector<std::string> kLossKinds = {"normal", "large", "offset", "extreme"};

std::vector<at::Tensor> loss_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const int64_t r = c.int_arg("reduction", 1), ign = c.int_arg("ignore_index", -100);
  switch (c.op) {
    case OpId::kMseLoss: return {at::mse_loss(in[0], in[1], r)};
    case OpId::kSmoothL1Loss: return {at::smooth_l1_loss(in[0], in[1], r, c.double_arg("beta", 1.0))};
    case OpId::kHuberLoss: return {at::huber_loss(in[0], in[1], r, c.double_arg("delta", 1.0))};
    case OpId::kBinaryCrossEntropy: return {at::binary_cross_entropy(in[0], in[1], opt(in[2]), r)};
    case OpId::kBceWithLogits:
      return {at::binary_cross_entropy_with_logits(in[0], in[1], opt(in[2]), opt(in[3]), r)};
    case OpId::kNllLoss: {
      auto o = at::nll_loss_forward(in[0], in[1], opt(in[2]), r, ign);
      return {std::get<0>(o), std::get<1>(o)};
    }
    default: {
      auto o = at::nll_loss2d_forward(in[0], in[1], opt(in[2]), r, ign);
      return {std::get<0>(o), std::get<1>(o)};
    }
  }
}

// The drawn values made ones the loss accepts, in place (metadata kept):
//   bce: self in (0, 1) (sigmoid; large inputs reach 0 and 1 exactly, eager's -100 log clamp),
//        target in [0, 1], every other element a hard 0/1 label;
//   bce with logits: self the drawn logits (the large and extreme kinds saturate the sigmoid
//        both ways), target as bce's, pos_weight non-negative (a ratio of positives; weight
//        keeps its sign, as bce's);
//   nll: targets are the drawn integers mod C, and about one in eight is ignore_index (int64
//        targets); class weights non-negative, as class weights are (a total weight near zero
//        from signed weights would make the mean's test only a test of cancellation).
void loss_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device) {
  const LossKind kind = loss_kind(c.op);
  if (kind == LossKind::kBce || kind == LossKind::kBceLogits) {
    if (kind == LossKind::kBce) in[0].copy_(in[0].to(at::kFloat).sigmoid());
    else if (in[3].defined()) in[3].abs_();
    at::Tensor t = in[1].to(at::kFloat).contiguous().sigmoid_();
    at::Tensor flat = t.view(-1);
    flat.slice(0, 0, flat.numel(), 2).round_();
    in[1].copy_(t);
    return;
  }
  if (loss_kind(c.op) != LossKind::kNll) return;
  auto g = loss_geometry(c);
  if (!g.is_ok()) return;
  at::Tensor raw = in[1].to(at::kLong);
  at::Tensor cls = raw.remainder(g->classes);
  if (in[1].scalar_type() == at::kLong)
    cls = at::where(raw.div(g->classes, "floor").remainder(8).eq(0), at::full_like(cls, g->ignore_index), cls);
  in[1].copy_(cls);
  if (in[2].defined()) in[2].abs_();
}

// Per term, in fp64 and broadcast to the output's elementwise shape: the term's value and its
// condition magnitude h = |f'(d) d| + |term| (d = self - target rounds once relative to itself;
// f is the loss of d), for bce |w| (|t - 1| |log1p(-x)| + |t| |log x|) + |term| (the logs of
// exact inputs round once relative to themselves, no cancellation: both products are >= 0), for
// nll |term| (one multiply). nll also gives each term's weight (0 where ignored).
struct Terms {
  at::Tensor value, h, weight;
};

// bce with logits, v = w ((1 - t) x + lw sp) with sp = -log_sigmoid(x) = max(-x, 0) +
// log1p(exp(-|x|)) >= 0 and lw = 1 + (p - 1) t (1 without pos_weight), formed as eager forms it
// from exact inputs. Its rounding errors, in units of u, to first order:
//   (1 - t) x       |1 - t| |x| for 1 - t, as much again for the product;
//   sp              <= 3 |sp|: exp(-|x|) and log1p are within about an ulp each, and log1p(e)
//                   has condition e / ((1 + e) log1p(e)) <= 1 on e in (0, 1]; max(-x, 0) is
//                   exact and both parts are >= 0, so their sum rounds relative to sp;
//   lw              2 |p - 1| |t| (p - 1, then the product) + |lw| (the add of 1);
//   lw sp           |sp| |delta lw| + |lw| |delta sp| + |lw sp| (the product);
//   the difference and the weight: |v| each.
// So h = |w| (2 |1 - t| |x| + |sp| (2 |p - 1| |t| + 5 |lw|)) + 2 |v|. It is large where the two
// parts cancel (x << 0 with t near 0: v ~ exp(x) while both parts are ~ |x|), as eager's formula
// is there; a kernel that forms the terms otherwise is held to the same budget.
Terms logits_terms(const std::vector<at::Tensor>& in) {
  const at::Tensor x = f64(in[0]), t = f64(in[1]);
  at::Tensor sp = (-x).clamp_min_(0).add_(x.abs().neg_().exp_().log1p_());
  at::Tensor lw = at::ones({}, x.options()), pm1 = at::zeros({}, x.options());
  if (in[3].defined()) {
    pm1 = f64(in[3]).sub_(1);
    lw = (pm1 * t).add_(1);
  }
  at::Tensor w = in[2].defined() ? f64(in[2]) : at::ones({}, x.options());
  at::Tensor v = ((1 - t) * x + lw * sp) * w;
  at::Tensor h = ((1 - t).abs_() * x.abs() * 2 + sp * ((pm1.abs() * t.abs()).mul_(2) + lw.abs() * 5)) * w.abs();
  return {v, h.add_(v.abs() * 2), at::Tensor()};
}

Terms elementwise_terms(const OpCall& c, const std::vector<at::Tensor>& in, const LossGeom& g) {
  if (g.kind == LossKind::kBceLogits) return logits_terms(in);
  const at::Tensor x = f64(in[0]), t = f64(in[1]);
  if (g.kind == LossKind::kBce) {
    at::Tensor lx = x.log().clamp_min_(-100), l1 = (-x).log1p_().clamp_min_(-100);
    at::Tensor w = in[2].defined() ? f64(in[2]) : at::ones({}, x.options());
    at::Tensor v = ((t - 1) * l1 - t * lx) * w;
    at::Tensor h = ((t - 1).abs_() * l1.abs() + t.abs() * lx.abs()) * w.abs();
    return {v, h.add_(v.abs()), at::Tensor()};
  }
  at::Tensor d = x - t, a = d.abs();
  at::Tensor v, fd;   // the term and |f'(d) d|
  const double p = g.param;
  if (g.kind == LossKind::kMse) {
    v = d.square();
    fd = 2 * v;
  } else if (g.kind == LossKind::kSmoothL1) {
    at::Tensor quad = a < p;
    v = at::where(quad, 0.5 * a.square() / p, a - 0.5 * p);
    fd = at::where(quad, a.square() / p, a);
  } else {
    at::Tensor quad = a < p;
    v = at::where(quad, 0.5 * a.square(), p * (a - 0.5 * p));
    fd = at::where(quad, a.square(), p * a);
  }
  return {v, fd.add_(v.abs()), at::Tensor()};
}

Terms nll_terms(const std::vector<at::Tensor>& in, const LossGeom& g) {
  const at::Tensor& x = in[0];   // only the picked elements go to fp64 (exactly), not all C a row
  const at::Tensor t = in[1].to(at::kLong);
  at::Tensor valid = t.ne(g.ignore_index);
  at::Tensor idx = t.clamp(0, g.classes - 1);
  // self's picked element per target: class axis 1 (0 for 1d self).
  at::Tensor picked = f64(g.one_d ? x.gather(0, idx.reshape({1})).reshape(t.sizes()) : x.gather(1, idx.unsqueeze(1)).squeeze(1));
  at::Tensor w = in[2].defined() ? f64(in[2]).index({idx}) : at::ones(t.sizes(), picked.options());
  w = w.masked_fill(valid.logical_not(), 0.0);
  at::Tensor v = -(picked * w);
  return {v, v.abs(), w};
}

// Calls f(part, r0, len) with the elementwise losses' inputs broadcast to the terms' shape and cut
// into slices of its leading axis (for_each_model_slice): the terms' fp64 temporaries
// stay a slice's (a loss over 2^30 terms otherwise held about eight fp64 copies of its inputs).
template <class F>
void for_each_term_slice(const std::vector<at::Tensor>& in, F f) {
  std::vector<int64_t> shape;
  for (const auto& t : in)
    if (t.defined()) shape = at::infer_size(shape, t.sizes());
  if (shape.empty()) return f(in, 0, 1);
  std::vector<at::Tensor> ex;
  for (const auto& t : in) ex.push_back(t.defined() ? t.expand(shape) : t);
  int64_t per = 1;
  for (size_t d = 1; d < shape.size(); ++d) per *= shape[d];
  for_each_model_slice(shape[0], per, [&](int64_t r0, int64_t len) {
    std::vector<at::Tensor> part;
    for (const auto& t : ex) part.push_back(t.defined() ? t.narrow(0, r0, len) : t);
    f(part, r0, len);
  });
}

// Output j's condition magnitude, output-shaped. Reduction none: h per term (nll's total_weight
// is then an exact 0). A sum of n terms in fp32 errs by about sqrt(n) ulp of sum |term| in any
// order (the reduction models of the other families), on top of each term's own rounding, so with
// g = sqrt(n): sum  g sum |term| + sum h + |y|; mean the same over n. nll's mean y = S / W divides
// two sums, S's error and |y| times W's: (g sum |term| + sum h + |y| g sum |w|) / |W| + |y|; its
// total_weight W: g sum |w| + |W|.
at::Tensor loss_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t j) {
  auto gr = loss_geometry(c);
  const at::TensorOptions o = in[0].options().dtype(at::kDouble);
  if (!gr.is_ok()) return at::zeros(c.outputs[j].sizes, o);
  const LossGeom& g = gr.value();
  const double gs = std::sqrt(static_cast<double>(std::max<int64_t>(g.terms, 1)));
  if (g.kind != LossKind::kNll) {
    if (g.elementwise() && j > 0) return at::zeros({}, o);
    at::Tensor out = g.elementwise() ? at::empty(c.outputs[0].sizes, o) : at::Tensor();
    at::Tensor V = at::zeros({}, o), A = at::zeros({}, o), H = at::zeros({}, o);
    for_each_term_slice(in, [&](const std::vector<at::Tensor>& part, int64_t r0, int64_t len) {
      const Terms tm = elementwise_terms(c, part, g);
      if (out.defined()) {
        (out.dim() == 0 ? out : out.narrow(0, r0, len)).copy_(tm.h.expand(tm.value.sizes()));
        return;
      }
      V.add_(tm.value.sum());
      A.add_(tm.value.abs().sum());
      H.add_(tm.h.expand(tm.value.sizes()).sum());
    });
    if (out.defined()) return out;
    const at::Tensor E = A.mul_(gs).add_(H);   // S's error / u
    if (g.reduction != LossReduction::kMean) return E.add_(V.abs());
    const double n = static_cast<double>(g.terms);
    return E.div_(n).add_((V / n).abs_());
  }
  const Terms tm = nll_terms(in, g);
  if (g.elementwise()) return j == 0 ? tm.h.expand(c.outputs[0].sizes).contiguous() : at::zeros({}, o);
  const at::Tensor V = tm.value.sum();
  const at::Tensor E = tm.value.abs().sum().mul_(gs).add_(tm.h.expand(tm.value.sizes()).sum());   // S's error / u
  const at::Tensor W = tm.weight.sum(), Wg = tm.weight.abs().sum().mul_(gs);
  if (j == 1) return Wg.add_(W.abs());
  if (g.reduction != LossReduction::kMean) return E.add_(V.abs());
  const at::Tensor y = (V / W).abs_();
  return E.add_(y * Wg).div_(W.abs()).add_(y);
}

// A reduction (so numerics treats it as one); the model itself is loss_whole.
RowLayout loss_layout(const OpCall&, const std::vector<at::Tensor>&, size_t) {
  RowLayout l;
  l.model = true;
  return l;
}
RowView loss_view(size_t) { return RowView::kWhole; }

// ---- backward: grad_output, then the forward's tensors (nll: total_weight last) -----------------

std::vector<at::Tensor> loss_backward_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const int64_t r = c.int_arg("reduction", 1), ign = c.int_arg("ignore_index", -100);
  switch (c.op) {
    case OpId::kMseLossBackward: return {at::mse_loss_backward(in[0], in[1], in[2], r)};
    case OpId::kBinaryCrossEntropyBackward: return {at::binary_cross_entropy_backward(in[0], in[1], in[2], opt(in[3]), r)};
    case OpId::kNllLossBackward: return {at::nll_loss_backward(in[0], in[1], in[2], opt(in[3]), r, ign, in[4])};
    case OpId::kSmoothL1LossBackward: return {at::smooth_l1_loss_backward(in[0], in[1], in[2], r, c.double_arg("beta", 1.0))};
    case OpId::kHuberLossBackward: return {at::huber_loss_backward(in[0], in[1], in[2], r, c.double_arg("delta", 1.0))};
    default: return {at::nll_loss2d_backward(in[0], in[1], in[2], opt(in[3]), r, ign, in[4])};
  }
}

// The forward's inputs as the forward draws them; nll's total_weight the forward's own, as in
// training.
void loss_backward_derive(const OpCall& c, std::vector<at::Tensor>& in, at::Device dev) {
  std::vector<at::Tensor> fwd(in.begin() + 1, in.end());
  loss_derive(c, fwd, dev);   // in place: the same tensors
  if (loss_kind(c.op) != LossKind::kNll) return;
  const int64_t r = c.int_arg("reduction", 1), ign = c.int_arg("ignore_index", -100);
  auto o = c.op == OpId::kNllLossBackward ? at::nll_loss_forward(in[1], in[2], opt(in[3]), r, ign)
                                          : at::nll_loss2d_forward(in[1], in[2], opt(in[3]), r, ign);
  in[4].copy_(std::get<1>(o));
}

}  // namespace

extern const FamilyReference kLossBackwardReference{&loss_backward_eager, &kLossKinds, 1e3, 3.0, &loss_backward_derive,
                                                    nullptr, nullptr, nullptr, false, nullptr};

extern const FamilyReference kLossReference{&loss_eager, &kLossKinds, 1e3, 3.0, &loss_derive,
                                            &loss_layout, &loss_view, nullptr, false, &loss_whole};

}  // namespace kc::evolve
