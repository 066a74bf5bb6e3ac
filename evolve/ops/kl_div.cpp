// KL divergence, schema half: the call from a shape and its outputs (kl_div.h kl_div_geometry).
//   forward: self (the lead sizes) and target of the same sizes and dtype; scalars reduction
//     (default mean) and log_target (false).
//   backward: grad first (self's sizes for reduction none, else 0-dim), then self and target.
#include "evolve/ops/kl_div.h"

#include <variant>

#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }
bool floating(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }
bool is_backward(OpId op) { return op == OpId::kKlDivBackward; }

Status make(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  const int64_t reduction = args.value("reduction", int64_t{1});
  c.inputs = {dense_meta("self", sizes, dt), dense_meta("target", sizes, dt)};
  c.scalars = {{"reduction", reduction}, {"log_target", args.value("log_target", false)}};
  if (is_backward(op))
    c.inputs.insert(c.inputs.begin(), dense_meta("grad", reduction == 0 ? sizes : std::vector<int64_t>{}, dt));
  return Status::ok();
}

Result<std::vector<TensorMeta>> outputs(const OpCall& c) {
  auto g = kl_div_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta& x = *c.input("self");
  if (g->backward || g->elementwise()) return std::vector<TensorMeta>{dense_meta("out0", x.sizes, x.dtype)};
  return std::vector<TensorMeta>{dense_meta("out0", {}, x.dtype)};
}

}  // namespace

Result<KlDivGeom> kl_div_geometry(const OpCall& c) {
  KlDivGeom g;
  g.backward = is_backward(c.op);
  const TensorMeta *x = c.input("self"), *t = c.input("target");
  if (!x || !t || !x->defined || !t->defined) return invalid("kl_div needs self and target");
  if (!floating(x->dtype)) return invalid("kl_div: self must be f32, bf16 or f16");
  if (t->sizes != x->sizes || t->dtype != x->dtype) return invalid("kl_div: target must match self (no broadcasting here)");
  const int64_t r = c.int_arg("reduction", 1);
  if (r < 0 || r > 2) return invalid("reduction must be 0 (none), 1 (mean) or 2 (sum)");
  g.reduction = static_cast<LossReduction>(r);
  const ScalarArg* lt = c.scalar("log_target");
  g.log_target = lt && std::holds_alternative<bool>(lt->value) && std::get<bool>(lt->value);
  g.dt = x->dtype;
  g.terms = x->numel();
  if (g.backward) {
    const TensorMeta* gr = c.input("grad");
    if (!gr || !gr->defined || gr->dtype != g.dt) return invalid("kl_div_backward needs grad in self's dtype");
    if (g.elementwise() ? gr->sizes != x->sizes : gr->numel() != 1)
      return invalid("kl_div_backward: grad must have the forward output's shape");
  }
  return g;
}

extern const FamilySchema kKlDivSchema{&make, &outputs};
extern const FamilySchema kKlDivBackwardSchema{&make, &outputs};

}  // namespace kc::evolve
