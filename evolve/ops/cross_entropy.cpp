// Cross-entropy, schema half: the call from a shape and its outputs, with eager's checks so a call
// eager would refuse is refused here too (cross_entropy.h cross_entropy_geometry).
//   forward: self [N, C] or [C] (the lead sizes), target int64 [N] / [] or probabilities
//     ({"probs": true}: self's sizes), optional weight [C] ({"weight": true}); scalars reduction
//     (default mean), ignore_index (-100), label_smoothing (0), upcast (false; {"upcast": true}:
//     autocast's form, the loss in fp32).
//   backward: grad (the loss's shape and dtype) first, the forward's tensors, lse ([N] fp32) last.
#include "evolve/ops/cross_entropy.h"

#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }
bool floating(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

bool is_backward(OpId op) { return op == OpId::kCrossEntropyBackward; }

Status make_forward(const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (sizes.size() != 1 && sizes.size() != 2) return invalid("cross_entropy takes self [N, C] or [C]");
  const bool upcast = args.value("upcast", false), probs = args.value("probs", false);
  const DType side = upcast ? DType::kF32 : dt;   // what autocast hands eager for the other tensors
  const int64_t C = sizes.back();
  std::vector<int64_t> tsz;
  if (sizes.size() == 2) tsz.push_back(sizes[0]);
  c.inputs = {dense_meta("self", sizes, dt), probs ? dense_meta("target", sizes, side) : dense_meta("target", tsz, DType::kI64),
              args.value("weight", false) ? dense_meta("weight", {C}, side) : absent_meta("weight")};
  c.scalars = {{"reduction", args.value("reduction", int64_t{1})},
               {"ignore_index", args.value("ignore_index", int64_t{-100})},
               {"label_smoothing", args.value("label_smoothing", 0.0)},
               {"upcast", upcast}};
  return Status::ok();
}

Status make(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (Status st = make_forward(sizes, dt, args, c); !st) return st;
  if (!is_backward(op)) return Status::ok();
  c.op = OpId::kCrossEntropy;   // the forward's checks; grad and lse are added below
  auto g = cross_entropy_geometry(c);
  c.op = op;
  if (!g.is_ok()) return g.status();
  std::vector<int64_t> gsz, lsz;
  if (!g->one_d) lsz.push_back(g->rows);
  if (g->per_row()) gsz = lsz;
  c.inputs.insert(c.inputs.begin(), dense_meta("grad", gsz, g->loss_dtype()));
  c.inputs.push_back(dense_meta("lse", lsz, DType::kF32));
  return Status::ok();
}

Result<std::vector<TensorMeta>> outputs(const OpCall& c) {
  auto g = cross_entropy_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta& x = *c.input("self");
  if (g->backward) return std::vector<TensorMeta>{dense_meta("out0", x.sizes, x.dtype)};
  std::vector<int64_t> lsz;
  if (!g->one_d) lsz.push_back(g->rows);
  return std::vector<TensorMeta>{dense_meta("out0", g->per_row() ? lsz : std::vector<int64_t>{}, g->loss_dtype()),
                                 dense_meta("out1", lsz, DType::kF32)};
}

// The target, weight and (backward) grad and lse against self, as eager checks them.
Status check_tensors(const OpCall& c, CrossEntropyGeom& g) {
  const TensorMeta& t = *c.input("target");
  const DType side = g.upcast ? DType::kF32 : g.dt;
  auto side_ok = [&](DType d) { return d == g.dt || d == side; };
  const std::vector<int64_t> rows = g.one_d ? std::vector<int64_t>{} : std::vector<int64_t>{g.rows};
  if (g.probs) {
    if (t.sizes != c.input("self")->sizes || !side_ok(t.dtype)) return invalid("cross_entropy: probability target must match self");
    if (g.ignore_index >= 0) return invalid("cross_entropy: ignore_index is not supported for probability targets");
  } else if (t.sizes != rows) {
    return invalid("cross_entropy: target sizes do not match self");
  }
  const TensorMeta* w = c.input("weight");
  g.weighted = w && w->defined;
  if (g.weighted && (w->sizes != std::vector<int64_t>{g.classes} || !side_ok(w->dtype)))
    return invalid("cross_entropy: weight must be [C] of self's dtype");
  if (!g.backward) return Status::ok();
  const TensorMeta *gr = c.input("grad"), *lse = c.input("lse");
  if (!gr || !gr->defined || !lse || !lse->defined) return invalid("cross_entropy_backward needs grad and lse");
  if (gr->sizes != (g.per_row() ? rows : std::vector<int64_t>{}) || !floating(gr->dtype))
    return invalid("cross_entropy_backward: grad must have the loss's shape");
  if (lse->sizes != rows || lse->dtype != DType::kF32) return invalid("cross_entropy_backward: lse must be fp32 [N]");
  return Status::ok();
}

}  // namespace

Result<CrossEntropyGeom> cross_entropy_geometry(const OpCall& c) {
  CrossEntropyGeom g;
  g.backward = is_backward(c.op);
  const TensorMeta *x = c.input("self"), *t = c.input("target");
  if (!x || !t || !x->defined || !t->defined) return invalid("cross_entropy needs self and target");
  if (!floating(x->dtype)) return invalid("cross_entropy: self must be f32, bf16 or f16");
  if (x->sizes.size() != 1 && x->sizes.size() != 2) return invalid("cross_entropy takes self [N, C] or [C]");
  g.dt = x->dtype;
  g.one_d = x->sizes.size() == 1;
  g.rows = g.one_d ? 1 : x->sizes[0];
  g.classes = x->sizes.back();
  if (g.classes <= 0) return invalid("cross_entropy: no classes");
  const int64_t r = c.int_arg("reduction", 1);
  if (r < 0 || r > 2) return invalid("reduction must be 0 (none), 1 (mean) or 2 (sum)");
  g.reduction = static_cast<LossReduction>(r);
  g.ignore_index = c.int_arg("ignore_index", -100);
  g.label_smoothing = c.double_arg("label_smoothing", 0.0);
  if (!(g.label_smoothing >= 0.0 && g.label_smoothing <= 1.0)) return invalid("label_smoothing must be in [0, 1]");
  const ScalarArg* up = c.scalar("upcast");
  g.upcast = up && std::holds_alternative<bool>(up->value) && std::get<bool>(up->value);
  g.probs = floating(t->dtype);
  if (!g.probs && t->dtype != DType::kI64) return invalid("cross_entropy: target must be int64 classes or probabilities");
  if (Status st = check_tensors(c, g); !st) return st;
  return g;
}

extern const FamilySchema kCrossEntropySchema{&make, &outputs};
extern const FamilySchema kCrossEntropyBackwardSchema{&make, &outputs};

}  // namespace kc::evolve
