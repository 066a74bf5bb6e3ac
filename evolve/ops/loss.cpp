// Losses, schema half: the call from a shape and its outputs, with ATen's shape checks so a call
// eager would refuse is refused here too (loss.h loss_geometry).
//   elementwise (mse_loss, smooth_l1_loss, huber_loss, binary_cross_entropy): self and target of
//     the lead sizes (bce: an optional weight of the same sizes, {"weight": true}); ATen
//     broadcasts them, and so do the outputs here: reduction none gives the broadcast shape in
//     the promoted dtype, mean and sum a 0-dim tensor.
//   binary_cross_entropy_with_logits: self (logits) and target of the lead sizes, then weight and
//     pos_weight, each absent (default), self's sizes (true), self's last dim ("last", pos_weight's
//     usual [C]) or the sizes given ({"pos_weight": [1, 7]}); the result has target's sizes and
//     dtype, and what eager cannot broadcast into them in place is refused (logits_result).
//   nll_loss_forward: self [N, C] or [C], int64 target [N] or [], optional weight [C]
//     ({"weight": true}), ignore_index; nll_loss2d_forward: self [N, C, H, W], target [N, H, W].
//     Outputs (output, total_weight): output [N] (resp. [N, H, W]) for reduction none on a
//     batched input, else 0-dim; total_weight 0-dim; both in self's dtype.
// Every loss takes `reduction` (0 none, 1 mean, 2 sum; default mean). The backward ops (family
// LossBackward: mse_loss_backward, binary_cross_entropy_backward, nll_loss_backward,
// nll_loss2d_backward, smooth_l1_loss_backward, huber_loss_backward) take grad_output first, then
// the forward's arguments (beta, delta included) and nll's total_weight last; grad_input is self's.
#include "evolve/ops/loss.h"

#include <algorithm>

#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }
bool nll(OpId op) { return op == OpId::kNllLoss || op == OpId::kNllLoss2d; }

// bce with logits' weight or pos_weight from its JSON argument (the header says which forms).
Result<TensorMeta> logits_param(const char* name, const nlohmann::json& a, const std::vector<int64_t>& sizes, DType dt) {
  if (a.is_null() || (a.is_boolean() && !a.get<bool>())) return absent_meta(name);
  if (a.is_boolean()) return dense_meta(name, sizes, dt);
  if (a.is_string() && a.get<std::string>() == "last" && !sizes.empty()) return dense_meta(name, {sizes.back()}, dt);
  if (!a.is_array()) return invalid(std::string(name) + " takes true, \"last\" or a list of sizes");
  std::vector<int64_t> s;
  for (const auto& v : a) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return invalid(std::string(name) + ": sizes must be integers >= 0");
    s.push_back(v.get<int64_t>());
  }
  return dense_meta(name, s, dt);
}

Status make_bce_logits(const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt), dense_meta("target", sizes, dt)};
  for (const char* name : {"weight", "pos_weight"}) {
    auto m = logits_param(name, args.contains(name) ? args[name] : nlohmann::json(), sizes, dt);
    if (!m.is_ok()) return m.status();
    c.inputs.push_back(m.value());
  }
  c.scalars = {{"reduction", args.value("reduction", int64_t{1})}};
  return Status::ok();
}

bool floating(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kF16 || d == DType::kBF16; }

Status make_loss(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  if (op == OpId::kBceWithLogits) return make_bce_logits(sizes, dt, args, c);
  const bool weighted = args.value("weight", false);
  const int64_t reduction = args.value("reduction", int64_t{1});
  if (!nll(op)) {
    c.inputs = {dense_meta("self", sizes, dt), dense_meta("target", sizes, dt)};
    if (op == OpId::kBinaryCrossEntropy)
      c.inputs.push_back(weighted ? dense_meta("weight", sizes, dt) : absent_meta("weight"));
    c.scalars = {{"reduction", reduction}};
    if (op == OpId::kSmoothL1Loss) c.scalars.push_back({"beta", args.value("beta", 1.0)});
    if (op == OpId::kHuberLoss) c.scalars.push_back({"delta", args.value("delta", 1.0)});
    return Status::ok();
  }
  const size_t rank = op == OpId::kNllLoss2d ? 4 : sizes.size();
  if (sizes.size() != rank || (op == OpId::kNllLoss && rank != 1 && rank != 2))
    return invalid(op == OpId::kNllLoss ? "nll_loss takes self [N, C] or [C]" : "nll_loss2d takes self [N, C, H, W]");
  std::vector<int64_t> tsz = {};
  if (rank >= 2) tsz.push_back(sizes[0]);
  if (rank == 4) tsz.insert(tsz.end(), {sizes[2], sizes[3]});
  const int64_t C = rank == 1 ? sizes[0] : sizes[1];
  c.inputs = {dense_meta("self", sizes, dt), dense_meta("target", tsz, DType::kI64),
              weighted ? dense_meta("weight", {C}, dt) : absent_meta("weight")};
  c.scalars = {{"reduction", reduction}, {"ignore_index", args.value("ignore_index", int64_t{-100})}};
  return Status::ok();
}

// The promoted dtype of two floating tensors (ATen's rule for the ones a loss meets).
DType promote(DType a, DType b) {
  if (a == b || !floating(b)) return a;
  if (!floating(a)) return b;
  if (a == DType::kF64 || b == DType::kF64) return DType::kF64;
  return DType::kF32;   // f32 with anything, or f16 with bf16
}

Result<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                       const char* what = "self and target") {
  std::vector<int64_t> out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return invalid(std::string("loss: ") + what + " do not broadcast");
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

// bce with logits as eager forms it, in place (ATen's Loss.cpp): (1 - target) is the result, so
// it has target's sizes and dtype; self, weight and the broadcast of pos_weight and target must
// broadcast into it, the latter into self's sizes too (log_sigmoid(self) *= it). Anything that
// would grow a tensor in place is an error in eager, so kInvalid here.
Result<TensorMeta> logits_result(const OpCall& c) {
  const TensorMeta &x = *c.input("self"), &t = *c.input("target");
  auto into = [](const std::vector<int64_t>& a, const std::vector<int64_t>& dst) {
    auto b = broadcast(a, dst, "bce with logits' tensors");
    return b.is_ok() && b.value() == dst;
  };
  if (!into(x.sizes, t.sizes)) return invalid("bce with logits: self does not broadcast into target's sizes");
  const TensorMeta *w = c.input("weight"), *pw = c.input("pos_weight");
  if (w && w->defined && !into(w->sizes, t.sizes)) return invalid("bce with logits: weight does not broadcast into target's sizes");
  if (pw && pw->defined) {
    auto lw = broadcast(pw->sizes, t.sizes, "pos_weight and target");
    if (!lw.is_ok() || !into(lw.value(), x.sizes)) return invalid("bce with logits: pos_weight does not broadcast into self's sizes");
  }
  return dense_meta("out0", t.sizes, t.dtype);
}

// The shape and dtype of every elementwise loss's result: self and target broadcast, their
// dtypes promoted (bce with logits: logits_result).
Result<TensorMeta> elementwise_result(const OpCall& c) {
  if (c.op == OpId::kBceWithLogits) return logits_result(c);
  const TensorMeta &x = *c.input("self"), &t = *c.input("target");
  auto shape = broadcast(x.sizes, t.sizes);
  if (!shape.is_ok()) return shape.status();
  return dense_meta("out0", shape.value(), promote(x.dtype, t.dtype));
}

Result<std::vector<TensorMeta>> loss_outputs(const OpCall& c) {
  auto g = loss_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta &x = *c.input("self"), &t = *c.input("target");
  if (g->kind == LossKind::kNll) {
    std::vector<int64_t> osz;
    if (g->elementwise()) osz = t.sizes;
    return std::vector<TensorMeta>{dense_meta("out0", osz, x.dtype), dense_meta("out1", {}, x.dtype)};
  }
  auto r = elementwise_result(c);
  if (!r.is_ok()) return r.status();
  return std::vector<TensorMeta>{dense_meta("out0", g->elementwise() ? r->sizes : std::vector<int64_t>{}, r->dtype)};
}

// The backward ops: grad_output (the forward output's shape: elementwise for reduction none, else
// 0-dim), then the forward's tensors; nll's total_weight (0-dim) last, as in the schemas.
Status make_loss_backward(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  const OpId fwd = loss_forward_of(op);
  if (Status st = make_loss(fwd, sizes, dt, args, c); !st) return st;
  auto g = loss_geometry(c);
  if (!g.is_ok()) return g.status();
  std::vector<int64_t> gsz;
  if (g->elementwise()) gsz = nll(fwd) ? c.inputs[1].sizes : sizes;
  c.inputs.insert(c.inputs.begin(), dense_meta("grad_output", gsz, dt));
  if (g->kind == LossKind::kNll) c.inputs.push_back(dense_meta("total_weight", {}, dt));
  return Status::ok();
}

// grad_input: self's sizes and dtype.
Result<std::vector<TensorMeta>> loss_backward_outputs(const OpCall& c) {
  auto g = loss_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta* go = c.input("grad_output");
  if (!go || !go->defined) return invalid("a loss backward needs grad_output");
  const TensorMeta& x = *c.input("self");
  return std::vector<TensorMeta>{dense_meta("out0", x.sizes, x.dtype)};
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

// bce with logits' parameter `name` against self's sizes (loss.h LossGeom::w_mod): its numel where
// it is a suffix broadcast of no higher rank than self, 0 where absent, -1 otherwise.
int64_t suffix_mod(const OpCall& c, const char* name, const std::vector<int64_t>& self) {
  const TensorMeta* p = c.input(name);
  if (!p || !p->defined) return 0;
  if (p->sizes.size() > self.size()) return -1;
  size_t lead = 0;
  while (lead < p->sizes.size() && p->sizes[lead] == 1) ++lead;
  const size_t tail = p->sizes.size() - lead;
  for (size_t i = 0; i < tail; ++i)
    if (p->sizes[lead + i] != self[self.size() - tail + i]) return -1;
  return std::max<int64_t>(p->numel(), 1);
}

// nll's checks (ATen's nll_loss_forward / nll_loss2d_forward meta checks): target sizes, its
// dtype (Long or Byte), a weight of C elements.
Status nll_geometry(const OpCall& c, LossGeom& g) {
  const TensorMeta &x = *c.input("self"), &t = *c.input("target");
  const size_t nd = x.sizes.size();
  if (!t.defined || (t.dtype != DType::kI64 && t.dtype != DType::kU8)) return invalid("nll target must be int64 or uint8");
  if (loss_forward_of(c.op) == OpId::kNllLoss2d) {
    if (nd != 4 || t.sizes.size() != 3) return invalid("nll_loss2d takes self [N, C, H, W] and target [N, H, W]");
    if (t.sizes[0] != x.sizes[0] || t.sizes[1] != x.sizes[2] || t.sizes[2] != x.sizes[3])
      return invalid("nll_loss2d: target sizes do not match self");
    g.spatial = x.sizes[2] * x.sizes[3];
  } else {
    if (nd != 1 && nd != 2) return invalid("nll_loss takes self [N, C] or [C]");
    if (t.sizes.size() > 1 || (nd == 2 ? t.sizes.size() != 1 || t.sizes[0] != x.sizes[0] : t.numel() != 1))
      return invalid("nll_loss: target sizes do not match self");
    g.one_d = nd == 1;
  }
  g.classes = nd == 1 ? x.sizes[0] : x.sizes[1];
  g.terms = t.numel();
  const TensorMeta* w = c.input("weight");
  g.weighted = w && w->defined;
  if (g.weighted && w->numel() != g.classes) return invalid("nll weight must have C elements");
  g.ignore_index = c.int_arg("ignore_index", -100);
  return Status::ok();
}

}  // namespace

OpId loss_forward_of(OpId op) {
  switch (op) {
    case OpId::kMseLossBackward: return OpId::kMseLoss;
    case OpId::kBinaryCrossEntropyBackward: return OpId::kBinaryCrossEntropy;
    case OpId::kNllLossBackward: return OpId::kNllLoss;
    case OpId::kNllLoss2dBackward: return OpId::kNllLoss2d;
    case OpId::kSmoothL1LossBackward: return OpId::kSmoothL1Loss;
    case OpId::kHuberLossBackward: return OpId::kHuberLoss;
    default: return op;
  }
}

LossKind loss_kind(OpId op) {
  switch (loss_forward_of(op)) {
    case OpId::kSmoothL1Loss: return LossKind::kSmoothL1;
    case OpId::kHuberLoss: return LossKind::kHuber;
    case OpId::kBinaryCrossEntropy: return LossKind::kBce;
    case OpId::kBceWithLogits: return LossKind::kBceLogits;
    case OpId::kNllLoss:
    case OpId::kNllLoss2d: return LossKind::kNll;
    default: return LossKind::kMse;
  }
}

Result<LossGeom> loss_geometry(const OpCall& c) {
  LossGeom g;
  g.kind = loss_kind(c.op);
  const TensorMeta *x = c.input("self"), *t = c.input("target");
  if (!x || !t || !x->defined || !t->defined) return invalid("a loss needs self and target");
  const int64_t r = c.int_arg("reduction", 1);
  if (r < 0 || r > 2) return invalid("reduction must be 0 (none), 1 (mean) or 2 (sum)");
  g.reduction = static_cast<LossReduction>(r);
  if (g.kind == LossKind::kNll) {
    if (Status st = nll_geometry(c, g); !st) return st;
    return g;
  }
  auto res = elementwise_result(c);
  if (!res.is_ok()) return res.status();
  g.terms = numel_of(res->sizes);
  const TensorMeta* w = c.input("weight");
  g.weighted = w && w->defined;
  if (g.kind == LossKind::kBceLogits) {
    const TensorMeta* pw = c.input("pos_weight");
    g.pos_weighted = pw && pw->defined;
    g.w_mod = suffix_mod(c, "weight", x->sizes);
    g.pw_mod = suffix_mod(c, "pos_weight", x->sizes);
  }
  if (g.kind == LossKind::kSmoothL1) g.param = c.double_arg("beta", 1.0);
  if (g.kind == LossKind::kHuber) g.param = c.double_arg("delta", 1.0);
  return g;
}

extern const FamilySchema kLossSchema{&make_loss, &loss_outputs};
extern const FamilySchema kLossBackwardSchema{&make_loss_backward, &loss_backward_outputs};

}  // namespace kc::evolve
