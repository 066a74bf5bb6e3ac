// The error model of the numerics stage (numerics.h attach_tolerance): for each element of a
// reduced output, the magnitude of what was summed into it, computed in fp64 from the inputs,
// turned into the tolerance a correct fp32 implementation meets in any summation order. Lives
// apart from numerics.cpp, which builds the sets and compares against these tolerances.
#include <algorithm>
#include <cmath>

#include "evolve/verify/numerics.h"
#include "evolve/ops/reference.h"
#include "runtime/ops.h"

namespace kc::evolve {
namespace {

constexpr int64_t kChunk = kNumericsChunk;
at::Tensor flat(const at::Tensor& t) { return t.reshape(-1); }

// The unit of roundoff a correct implementation works in for an output of dtype d: the dtype's
// epsilon, or bf16's / tf32's under those opt-in precision policies (fp32 outputs).
double output_eps(const OpCall& call, DType d) {
  if (d == DType::kF32 && call.policy == "bf16") return 3.9e-3;
  if (d == DType::kF32 && call.policy == "tf32") return 4.9e-4;
  return d == DType::kF64 ? 2.2e-16 : d == DType::kF32 ? 1.19e-7 : 7.8e-3;
}

// Rounding to nearest once into a half: at most its unit roundoff (2^-8 bf16, 2^-11 f16) of the
// value, and half f16's smallest subnormal (2^-25) where that underflows. Zero for other dtypes.
double half_roundoff(DType d) { return d == DType::kBF16 ? std::ldexp(1.0, -8) : d == DType::kF16 ? std::ldexp(1.0, -11) : 0; }
double half_underflow(DType d) { return d == DType::kF16 ? std::ldexp(1.0, -25) : 0; }

// Every operand as [rows, k] with the reduced axis last (a view for contiguous tensors reduced
// over their last axis), so the model runs over chunks of rows with fixed temporaries.
at::Tensor as_rows(const at::Tensor& t, int64_t dim, int64_t k) {
  return (t.dim() == 0 ? t.reshape({1}) : t.movedim(dim, -1)).reshape({-1, k});
}

RowLayout row_layout(const OpCall& call, const InputSet& s, size_t j) {
  const FamilyReference& fam = family_reference(op_info(call.op).family);
  if (!fam.layout || s.inputs.empty() || !s.inputs[0].defined()) return RowLayout{};
  return fam.layout(call, s.inputs, j);
}

// The condition magnitude H of output j (attach_tolerance) in fp64, chunk by chunk of rows:
// sink(r0, rows, h) with h [rows, k] (stat: [rows, 1]) in the output's row layout; a per-column
// output (col) is summed over all rows first and given as one [1, k] chunk.
template <class Sink>
void for_each_scale(const OpCall& call, const InputSet& s, size_t j, const RowLayout& l, Sink sink) {
  const FamilyReference& fam = family_reference(op_info(call.op).family);
  // Per-row operands as [rows, k] (or [rows, 1] for saved statistics); parameters stay whole.
  std::vector<at::Tensor> rows(s.inputs.size());
  std::vector<bool> sliced(s.inputs.size(), false);
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const at::Tensor& t = s.inputs[k];
    rows[k] = t;
    const RowView v = fam.view(k);
    sliced[k] = v != RowView::kWhole;
    if (!t.defined()) continue;
    if (v == RowView::kRows) rows[k] = as_rows(t, l.dim, l.k);
    else if (v == RowView::kStat) rows[k] = t.reshape({-1, 1});
  }
  const at::Tensor& o = s.ref64[j];
  at::Tensor r64 = l.col ? o.reshape({1, l.k}) : l.stat ? o.reshape({-1, 1}) : as_rows(o, l.dim, l.k);
  const int64_t nrows = rows[0].size(0);
  at::Tensor h = l.col ? at::zeros({1, l.k}, r64.options().dtype(at::kDouble)) : at::Tensor();
  const int64_t step = std::max<int64_t>(1, kChunk / l.k);
  for (int64_t r0 = 0; r0 < nrows; r0 += step) {
    const int64_t len = std::min(step, nrows - r0);
    Chunk c;
    for (size_t k = 0; k < rows.size(); ++k) c.in.push_back(sliced[k] ? rows[k].narrow(0, r0, len) : rows[k]);
    c.r64 = l.col ? r64 : r64.narrow(0, r0, len);
    // NaN from non-finite inputs: no model there (the floor, 16 ulp of |r64| + tau, still holds).
    if (l.col) h.add_(fam.scale(call, c, j, l));
    else sink(r0, len, fam.scale(call, c, j, l).nan_to_num_(0.0, INFINITY));
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

// A half output rounded once from an fp32 result within tol32 of r64: |fl(z) - r64| <= ur |z| +
// tol32 <= ur |r64| + (1 + ur) tol32, plus f16's underflow.
at::Tensor rounded_once(const at::Tensor& r64, at::Tensor tol32, DType d) {
  const double ur = half_roundoff(d);
  return tol32.mul_(1 + ur).add_(f64(r64).abs_().mul_(ur)).add_(half_underflow(d));
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
    if (!at::isFloatingType(r64.scalar_type())) {   // integer outputs (pooling indices) are exact
      s.tol[j] = at::full(r64.sizes(), 0.5, r64.options().dtype(at::kFloat));
      s.budget[j] = 0.5 / (1.0 + (j < s.tau.size() ? s.tau[j] : 0.0));   // half a unit, in the mixed measure
      continue;
    }
    const RowLayout l = row_layout(call, s, j);
    const DType od = call.outputs[j].dtype;
    // A half output rounded once: the fp32 model (eager's rounding error cannot open it past the
    // cap), then the rounding.
    const bool once = l.model && l.rounds_once && half_roundoff(od) > 0;
    const DType ud = l.precision != DType::kOther ? l.precision : once ? DType::kF32 : od;
    const double u = output_eps(call, ud), tau = s.tau[j];
    const double eager = j < s.eager_err.size() ? s.eager_err[j] : 0;
    at::Tensor tol = at::empty(r64.sizes(), r64.options().dtype(at::kFloat));
    at::Tensor tf = flat(tol), rf = flat(r64), ef = flat(s.ref[j]);
    double budget = 0, ratio = 0;
    // The tolerance of flat elements [off, off + len) from h (undefined: no model), into tol.
    auto apply = [&](int64_t off, int64_t len, const at::Tensor& h) {
      at::Tensor r = rf.narrow(0, off, len), e = ef.narrow(0, off, len);
      at::Tensor t = tolerance_of(r, h, u, tau, eager);
      if (once) t = rounded_once(r, t, od);
      at::Tensor fin = at::isfinite(r), both = fin & at::isfinite(e);
      budget = std::max(budget, (t / r.abs().add_(tau)).masked_fill_(fin.logical_not(), 0).max().item<double>());
      ratio = std::max(ratio, (f64(e) - r).abs_().div_(t).masked_fill_(both.logical_not(), 0).max().item<double>());
      tf.narrow(0, off, len).copy_(t);
    };
    const FamilyReference& fam = family_reference(op_info(call.op).family);
    const bool moved = fam.any_axis && r64.dim() > 1 && l.dim != r64.dim() - 1;
    if (fam.whole) {   // the family's model over the whole output, applied chunk by chunk: the
      // tolerance's fp64 temporaries stay a chunk's (an 8 GiB batch norm key otherwise peaked at 68 GB)
      at::Tensor h = fam.whole(call, s.inputs, j).reshape(-1).nan_to_num_(0.0, INFINITY);
      for (int64_t off = 0; off < rf.numel(); off += kChunk) {
        const int64_t len = std::min(kChunk, rf.numel() - off);
        apply(off, len, h.narrow(0, off, len));
      }
    } else if (!l.model) {
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
