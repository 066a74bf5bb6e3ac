// Pooling backward (max_pool2d/3d_with_indices_backward, avg_pool2d/3d_backward,
// _adaptive_avg_pool2d/3d_backward), schema half. A call is made from the forward input's (self's)
// sizes and the forward's JSON arguments (pool.cpp): grad_output (and the int64 indices of max
// pooling) take the forward output's sizes; grad_input is self-shaped. The adaptive backward has
// no scalars: its output size is grad_output's ("output_size" in JSON only shapes grad_output).
// {"channels_last": true} lays every tensor of a batched call out channels-last, as a
// channels_last network's autograd calls it; grad_input then follows eager's layout rule below.
#include "evolve/ops/family.h"
#include "evolve/ops/pool.h"

namespace kc::evolve {

OpId pool_forward_of(OpId op) {
  switch (op) {
    case OpId::kMaxPool2dBackward: return OpId::kMaxPool2d;
    case OpId::kMaxPool3dBackward: return OpId::kMaxPool3d;
    case OpId::kAvgPool2dBackward: return OpId::kAvgPool2d;
    case OpId::kAvgPool3dBackward: return OpId::kAvgPool3d;
    case OpId::kAdaptiveAvgPool2dBackward: return OpId::kAdaptiveAvgPool2d;
    default: return OpId::kAdaptiveAvgPool3d;
  }
}

namespace {

Status make_pool_backward(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  OpCall fwd;
  fwd.op = pool_forward_of(op);
  fwd.inputs = {dense_meta("self", sizes, dt)};
  Status st = pool_scalars(fwd.op, args, fwd);
  if (!st.is_ok()) return st;
  auto g = pool_geometry(fwd);
  if (!g.is_ok()) return g.status();
  std::vector<int64_t> out(sizes.begin(), sizes.end() - g->nd);
  for (int a = 3 - g->nd; a < 3; ++a) out.push_back(g->out[a]);
  c.inputs = {dense_meta("grad_output", out, dt), dense_meta("self", sizes, dt)};
  if (g->max) c.inputs.push_back(dense_meta("indices", out, DType::kI64));
  if (args.value("channels_last", false) && g->batched)
    for (auto& t : c.inputs) to_channels_last(t);
  return pool_scalars(op, args, c);
}

Result<std::vector<TensorMeta>> pool_backward_outputs(const OpCall& c) {
  auto g = pool_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta* x = c.input("self");
  // Eager lays grad_input out in self's suggested memory format where its kernel supports
  // channels-last (seen on the CPU: the 2d ops and max_pool3d; avg and adaptive 3d stay
  // contiguous). The gauntlet refuses a key whose eager output differs from what is inferred here
  // (verify/numerics.cpp), so a backend with another rule gets no kernel, never a wrong one.
  TensorMeta gi = dense_meta("out0", x->sizes, x->dtype);
  if (is_channels_last(*x) && (g->nd == 2 || g->max)) to_channels_last(gi);
  return std::vector<TensorMeta>{gi};
}

}  // namespace

extern const FamilySchema kPoolBackwardSchema{&make_pool_backward, &pool_backward_outputs};

}  // namespace kc::evolve
