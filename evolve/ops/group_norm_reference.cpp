// Group norm forward, torch half: the eager reference and the error model of a reduction over
// each (n, group) row of C / group * HxW contiguous elements.
#include "evolve/ops/reference.h"

#include <cmath>

namespace kc::evolve {
namespace {

const std::vector<std::string> kReductionKinds = {"normal", "large", "offset", "extreme"};

std::vector<at::Tensor> group_norm_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  auto r = at::native_group_norm(in[0], opt(in[1]), opt(in[2]), c.int_arg("N", 0), c.int_arg("C", 0),
                                 c.int_arg("HxW", 0), c.int_arg("group", 1), c.double_arg("eps", 1e-5));
  return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
}

// Output 0 in rows of its groups; the statistics one per row.
RowLayout group_norm_layout(const OpCall& c, const std::vector<at::Tensor>&, size_t j) {
  RowLayout l;
  l.model = true;
  const int64_t group = std::max<int64_t>(1, c.int_arg("group", 1));
  l.k = std::max<int64_t>(1, c.int_arg("C", 1) / group * c.int_arg("HxW", 1));
  l.dim = -1;
  l.stat = j > 0;
  return l;
}

RowView group_norm_view(size_t k) { return k == 0 ? RowView::kRows : RowView::kWhole; }

double abs_max(const at::Tensor& t, double dflt) { return t.defined() ? f64(t).abs_().max().item<double>() : dflt; }

// Layer norm's model over each group's row (layer_norm_reference.cpp), with the per-channel
// parameters bounded by their largest magnitudes (the chunk does not say which channels a row
// holds; a larger bound only widens the tolerance up to the model's cap).
at::Tensor group_norm_scale(const OpCall& call, const Chunk& c, size_t j, const RowLayout& l) {
  const double eps = call.double_arg("eps", 1e-5);
  const double g = std::sqrt(static_cast<double>(l.k));
  at::Tensor x = f64(c.in[0]);
  at::Tensor mean = x.mean(1, true), mabs = x.abs().mean(1, true);
  if (j == 1) return mean.abs_() + g * mabs;
  at::Tensor d = x - mean;
  at::Tensor var = d.square().mean(1, true), rstd = (var + eps).rsqrt();
  if (j == 2) return rstd * (1 + g * var / (var + eps));
  const double aw = abs_max(c.in[1], 1.0), ab = abs_max(c.in[2], 0.0);
  at::Tensor h = (x.abs_() + mean.abs()).mul_(rstd).mul_(aw).add_(ab).add_(f64(c.r64).abs_());
  return h.add_(d.abs_().add_(mabs).mul_(rstd).mul_(aw * g));
}

}  // namespace

// Offset rows sit at N(100, 1): a mean far from zero, where a one-pass variance cancels.
extern const FamilyReference kGroupNormReference{&group_norm_eager, &kReductionKinds, 1e3, 100.0, nullptr,
                                                 &group_norm_layout, &group_norm_view, &group_norm_scale, false, nullptr};

}  // namespace kc::evolve
