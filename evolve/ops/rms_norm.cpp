// RMSNorm, schema half: the call from a shape and its outputs, with eager's checks (rms_norm.h
// rms_norm_geometry).
//   forward: input (the lead sizes), weight ({"weight": false}: absent) over normalized_shape
//     ({"normalized_shape": [...]}, default the last size); scalars normalized_shape, eps (1e-6).
//   backward: grad (input's sizes and dtype), input, rstd (fp32, the statistics' sizes), weight;
//     scalars normalized_shape, eps, output_mask (default [1, weight]).
#include "evolve/ops/rms_norm.h"

#include <algorithm>

#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }
bool floating(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }
bool is_backward(OpId op) { return op == OpId::kRmsNormBackward; }

Status make(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.empty()) return invalid("rms_norm needs at least one dimension");
  const std::vector<int64_t> ns = args.contains("normalized_shape") ? args["normalized_shape"].get<std::vector<int64_t>>()
                                                                    : std::vector<int64_t>{sizes.back()};
  if (ns.empty() || ns.size() > sizes.size()) return invalid("normalized_shape must be the trailing sizes");
  const bool weighted = args.value("weight", true);
  TensorMeta w = weighted ? dense_meta("weight", ns, dt) : absent_meta("weight");
  const double eps = args.value("eps", 1e-6);
  if (!is_backward(op)) {
    c.inputs = {dense_meta("input", sizes, dt), w};
    c.scalars = {{"normalized_shape", ns}, {"eps", eps}};
    return Status::ok();
  }
  const std::vector<int64_t> mask = args.contains("output_mask") ? args["output_mask"].get<std::vector<int64_t>>()
                                                                 : std::vector<int64_t>{1, weighted};
  c.inputs = {dense_meta("grad", sizes, dt), dense_meta("input", sizes, dt),
              dense_meta("rstd", stat_sizes(sizes, ns.size()), DType::kF32), w};
  c.scalars = {{"normalized_shape", ns}, {"eps", eps}, {"output_mask", mask}};
  return Status::ok();
}

Result<std::vector<TensorMeta>> outputs(const OpCall& c) {
  auto g = rms_norm_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta& x = *c.input("input");
  if (!g->backward)
    return std::vector<TensorMeta>{dense_meta("out0", x.sizes, x.dtype), dense_meta("out1", g->stat_sizes, DType::kF32)};
  const TensorMeta& w = *c.input("weight");
  return std::vector<TensorMeta>{g->want_input ? dense_meta("out0", x.sizes, x.dtype) : absent_meta("out0"),
                                 g->want_weight ? dense_meta("out1", w.sizes, w.dtype) : absent_meta("out1")};
}

// The backward's grad and rstd against the input, as the forward made them.
Status check_backward(const OpCall& c, RmsNormGeom& g) {
  const TensorMeta *gr = c.input("grad"), *rs = c.input("rstd"), *x = c.input("input");
  if (!gr || !gr->defined || !rs || !rs->defined) return invalid("rms_norm_backward needs grad and rstd");
  if (gr->sizes != x->sizes || gr->dtype != x->dtype) return invalid("rms_norm_backward: grad must match the input");
  if (rs->sizes != g.stat_sizes || rs->dtype != DType::kF32)
    return invalid("rms_norm_backward: rstd must be fp32 with the statistics' sizes");
  const auto mask = c.list_arg("output_mask");
  if (mask.size() != 2) return invalid("rms_norm_backward: output_mask has two entries");
  g.want_input = mask[0] != 0;
  g.want_weight = mask[1] != 0 && g.weighted;
  if (!g.want_input && !g.want_weight) return invalid("rms_norm_backward: no output wanted");
  return Status::ok();
}

}  // namespace

Result<RmsNormGeom> rms_norm_geometry(const OpCall& c) {
  RmsNormGeom g;
  g.backward = is_backward(c.op);
  const TensorMeta* x = c.input("input");
  if (!x || !x->defined) return invalid("rms_norm needs an input");
  if (!floating(x->dtype)) return invalid("rms_norm: input must be f32, bf16 or f16");
  const std::vector<int64_t> ns = c.list_arg("normalized_shape");
  if (ns.empty() || ns.size() > x->sizes.size() ||
      !std::equal(ns.begin(), ns.end(), x->sizes.end() - static_cast<long>(ns.size())))
    return invalid("rms_norm: normalized_shape must be the input's trailing sizes");
  g.dt = x->dtype;
  for (size_t i = 0; i < x->sizes.size(); ++i) (i < x->sizes.size() - ns.size() ? g.rows : g.cols) *= x->sizes[i];
  if (g.cols <= 0) return invalid("rms_norm: an empty normalized shape");
  g.stat_sizes = stat_sizes(x->sizes, ns.size());
  g.eps = c.double_arg("eps", 1e-6);
  if (!(g.eps >= 0.0)) return invalid("rms_norm: eps must be non-negative");
  const TensorMeta* w = c.input("weight");
  g.weighted = w && w->defined;
  if (g.weighted && (w->sizes != ns || w->dtype != g.dt))
    return invalid("rms_norm: weight must be normalized_shape in the input's dtype");
  if (g.backward) {
    if (Status st = check_backward(c, g); !st) return st;
  }
  return g;
}

extern const FamilySchema kRmsNormSchema{&make, &outputs};
extern const FamilySchema kRmsNormBackwardSchema{&make, &outputs};

}  // namespace kc::evolve
