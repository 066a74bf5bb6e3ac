// Reductions, torch half: eager references and the error model. Every output element folds the
// r inputs it reduces in some order; the model is output-shaped (FamilyReference::whole), from the
// fp64 magnitudes of those inputs. Max, min and their indices select an input: exact. A product
// errs relatively (prod_model).
#include "evolve/ops/reference.h"

#include <cmath>

#include "evolve/ops/reduction.h"

namespace kc::evolve {
namespace {

// Non-finite inputs have one answer in any order: a sum or norm with a NaN (or both infinities)
// is NaN, max / min / argmax take the (first) NaN, the variance of a row with one is NaN; a
// product with a NaN, or with an infinity and a zero, is NaN.
const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme", "special"};

at::OptionalIntArrayRef dims_arg(const OpCall& c, std::vector<int64_t>& store) {
  const ScalarArg* a = c.scalar("dim");
  if (!a || std::holds_alternative<std::string>(a->value)) return std::nullopt;
  store = c.list_arg("dim");
  return at::IntArrayRef(store);
}

// The requested output dtype; none under run_fp64 (float64 inputs keep float64).
std::optional<at::ScalarType> dtype_arg(const OpCall& c, const at::Tensor& x) {
  const std::string want = c.string_arg("dtype", "none");
  auto d = dtype_from_name(want);
  if (want == "none" || !d || x.scalar_type() == at::kDouble) return std::nullopt;
  return to_scalar_type(*d);
}

std::optional<at::Scalar> correction_arg(const OpCall& c) {
  const ScalarArg* a = c.scalar("correction");
  if (!a || std::holds_alternative<std::string>(a->value)) return std::nullopt;
  if (auto* i = std::get_if<int64_t>(&a->value)) return at::Scalar(*i);
  return at::Scalar(c.double_arg("correction", 1.0));
}

std::vector<at::Tensor> reduction_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const at::Tensor& x = in[0];
  const bool keep = c.int_arg("keepdim", 0) != 0;
  std::vector<int64_t> store;
  const at::OptionalIntArrayRef dims = dims_arg(c, store);
  const at::IntArrayRef list = dims.has_value() ? *dims : at::IntArrayRef();
  switch (reduce_kind(c.op)) {
    case ReduceKind::kSum: return {at::sum(x, dims, keep, dtype_arg(c, x))};
    case ReduceKind::kMean: return {at::mean(x, dims, keep, dtype_arg(c, x))};
    case ReduceKind::kMax: return {at::amax(x, list, keep)};
    case ReduceKind::kMin: return {at::amin(x, list, keep)};
    case ReduceKind::kLogSumExp: return {at::logsumexp(x, list, keep)};
    case ReduceKind::kMaxDim:
    case ReduceKind::kMinDim: {
      auto r = c.op == OpId::kMax ? at::max(x, c.int_arg("dim", -1), keep) : at::min(x, c.int_arg("dim", -1), keep);
      return {std::get<0>(r), std::get<1>(r)};
    }
    case ReduceKind::kProd: return {at::prod(x, c.int_arg("dim", -1), keep, dtype_arg(c, x))};
    case ReduceKind::kArgMax:
    case ReduceKind::kArgMin: {
      std::optional<int64_t> d;
      if (const ScalarArg* a = c.scalar("dim"); a && std::holds_alternative<int64_t>(a->value)) d = c.int_arg("dim", 0);
      return {c.op == OpId::kArgmax ? at::argmax(x, d, keep) : at::argmin(x, d, keep)};
    }
    case ReduceKind::kVar: return {at::var(x, dims, correction_arg(c), keep)};
    case ReduceKind::kStd: return {at::std(x, dims, correction_arg(c), keep)};
    case ReduceKind::kVarMean: {
      auto r = at::var_mean(x, dims, correction_arg(c), keep);
      return {std::get<0>(r), std::get<1>(r)};
    }
    case ReduceKind::kStdMean: {
      auto r = at::std_mean(x, dims, correction_arg(c), keep);
      return {std::get<0>(r), std::get<1>(r)};
    }
    case ReduceKind::kNorm: {
      const ScalarArg* o = c.scalar("ord");
      const at::Scalar ord = o && std::holds_alternative<int64_t>(o->value) ? at::Scalar(c.int_arg("ord", 2))
                                                                             : at::Scalar(c.double_arg("ord", 2.0));
      return {at::linalg_vector_norm(x, ord, dims, keep, dtype_arg(c, x))};
    }
  }
  return {};
}

// A sum over the reduced dims of t (fp64), in the output's shape.
at::Tensor fold(const at::Tensor& t, const std::vector<bool>& reduced, bool keep) {
  std::vector<int64_t> d;
  for (size_t i = 0; i < reduced.size(); ++i)
    if (reduced[i]) d.push_back(static_cast<int64_t>(i));
  if (t.dim() == 0) return t.clone();
  return at::sum(t, d, keep);
}

// The unit the numerics stage scales a model by (error_model.cpp output_eps, without policies).
double unit_of(DType d) { return d == DType::kF64 ? 2.2e-16 : d == DType::kF32 ? 1.19e-7 : 7.8e-3; }

// A product of n factors, in units of the output's u. Each of the n - 1 multiplications rounds
// relatively (fp32, or fp64 for an fp64 output) whatever the order, and the store rounds once
// more: |y| (1 + n u_acc / u), plus half the output dtype's smallest subnormal (a tiny product
// rounds absolutely). Underflow: every partial product lies in [Q, P], Q and P the products of
// min(1, |x|) and max(1, |x|); where Q < FLT_MIN some order takes a partial product subnormal
// or to zero, which loses up to all of its bits, so up to |y| more is allowed there (a result
// anywhere between 0 and 2|y|). Overflow (P > FLT_MAX while |y| is finite: some order meets inf)
// shows as inf or NaN, which no tolerance admits: the non-finite check takes it only where eager
// or the fp64 result has it too, so an order that overflows where eager's does not is flagged.
at::Tensor prod_model(const at::Tensor& x, const at::Tensor& y, const std::vector<bool>& reduced, bool keep,
                      double n, DType out) {
  const double u = unit_of(out), uacc = out == DType::kF64 ? u : 1.19e-7;
  const double tiny = out == DType::kF64 ? 4.9e-324 : out == DType::kF32 ? 1.4e-45 : out == DType::kF16 ? 6e-8 : 9.2e-41;
  const at::Tensor log_q = fold(x.abs().clamp_max_(1.0).log_(), reduced, keep).reshape(y.sizes());
  at::Tensor h = y * (1 + n * uacc / u) + tiny / (2 * u);
  return h.add_(at::where(log_q < std::log(1.1754943508222875e-38), y / u, at::zeros_like(y)));
}

// Logsumexp y = m + log(s), m the max and s = sum exp(x - m) over n terms. Term i carries weight
// w_i = exp(x_i - y) (the derivative of y), and its rounding errs, relative to that term, by the
// subtraction x_i - m (u |x_i - m|) and by the exponential (a few u; 3 |x_i - m| u also admits an
// exp whose error grows with its argument); the sum of n positive terms adds sqrt(n) u
// relatively, in any order (the online max's rescalings are such roundings too), and the log
// and the final add round |log s| and |y|. In units of u: |y| + log(n) + sqrt(n) + 4 +
// 3 sum_i w_i |x_i - m|. Non-finite rows are the non-finite check's; their model is 0 here.
at::Tensor logsumexp_model(const at::Tensor& x, const at::Tensor& y, const std::vector<bool>& reduced, bool keep,
                           double n) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < reduced.size(); ++i)
    if (reduced[i]) dims.push_back(static_cast<int64_t>(i));
  const at::Tensor m = x.dim() == 0 ? x.clone() : at::amax(x, dims, true);
  const at::Tensor yk = x.dim() == 0 ? x.clone() : at::logsumexp(x, dims, true);
  const at::Tensor d = (x - m).abs_(), w = (x - yk).exp_();
  const at::Tensor wd = at::where(w > 0, w * d, at::zeros_like(d));
  at::Tensor h = fold(wd, reduced, keep).reshape(y.sizes()).mul_(3).add_(y.abs()).add_(std::log(n) + std::sqrt(n) + 4);
  return at::where(y.isfinite(), h, at::zeros_like(h));
}

// Output j's condition magnitude, output-shaped, fp64; u is the output dtype's unit roundoff.
// A sum of n terms in fp32 errs by about sqrt(n) ulp of sum |x| in any order; a mean is that / n;
// a p-norm (sum |x|^p)^(1/p) has that relative error over p, plus one pow rounding per term.
// Var: d = x - mean; a Welford or two-pass fold errs by sqrt(n) ulp of sum d^2 plus the
// deviations' own rounding, 2 sum |d||x| (the mean's error cancels to first order); over the
// divisor. Std: half var's relative error, at most sqrt of var's absolute error near zero.
at::Tensor reduction_whole(const OpCall& c, const std::vector<at::Tensor>& in, size_t j) {
  auto g = reduce_geometry(c);
  const at::Tensor x = f64(in[0]);
  const std::vector<int64_t> osz = c.outputs[j].sizes;
  if (!g.is_ok()) return at::zeros(osz, x.options());
  const bool keep = c.int_arg("keepdim", 0) != 0;
  const double n = std::max<double>(1.0, static_cast<double>(x.numel()) / std::max<int64_t>(1, c.outputs[j].numel()));
  const double sq = std::sqrt(n);
  const at::Tensor y_signed = run_fp64(c, in)[j], y = y_signed.abs();
  switch (g->kind) {
    case ReduceKind::kSum: return fold(x.abs(), g->reduced, keep).mul_(sq).add_(y).reshape(osz);
    case ReduceKind::kMean: return fold(x.abs(), g->reduced, keep).mul_(sq / n).add_(y).reshape(osz);
    case ReduceKind::kNorm:
      if (g->ord != NormOrd::kP) return at::zeros(osz, x.options());
      return (y * ((sq + 2) / g->p)).add_(y).reshape(osz);
    case ReduceKind::kProd: return prod_model(x, y.reshape(osz), g->reduced, keep, n, c.outputs[j].dtype);
    case ReduceKind::kLogSumExp: return logsumexp_model(x, y_signed, g->reduced, keep, n).reshape(osz);
    case ReduceKind::kMax:
    case ReduceKind::kMin:
    case ReduceKind::kArgMax:
    case ReduceKind::kArgMin:
    case ReduceKind::kMaxDim:
    case ReduceKind::kMinDim: return at::zeros(osz, x.options());
    default: break;
  }
  // The var family; output 1 (var_mean / std_mean) is the mean.
  if (j == 1) return fold(x.abs(), g->reduced, keep).mul_(sq / n).add_(y).reshape(osz);
  at::Tensor m = fold(x, g->reduced, true).div_(n);
  if (x.dim() == 0) m = m.reshape({});
  at::Tensor d = x - m;
  const double div = std::max(n - g->correction, 1.0);
  at::Tensor hv = fold(d * d, g->reduced, keep).mul_(sq).add_(fold(d.abs().mul_(x.abs()), g->reduced, keep).mul_(2)).div_(div);
  hv = hv.reshape(osz);
  if (g->kind == ReduceKind::kVar || g->kind == ReduceKind::kVarMean) return hv.add_(y);
  const double u = c.outputs[j].dtype == DType::kF32 ? 1.19e-7 : 7.8e-3;
  // The fold's own mean errs by about u times its scale and shifts every deviation by that: n
  // times its square over div, negligible for var, is first order for std near 0 (on a constant
  // row an fp32 fold's std is a few ulp of the value, not 0). fmin: there y = 0 and hv / 2y is NaN.
  const at::Tensor ms = fold(x.abs(), g->reduced, true).div_(n).add_(m.abs()).reshape(osz);
  hv = hv.add(ms.square().mul_(n * u / div));
  return at::fmin(hv / (2 * y), (hv / u).sqrt_()).add_(y);
}

}  // namespace

extern const FamilyReference kReductionReference{&reduction_eager, &kReductionKinds, 1e3, 3.0, nullptr, nullptr,
                                                 nullptr, nullptr, false, &reduction_whole};

}  // namespace kc::evolve
