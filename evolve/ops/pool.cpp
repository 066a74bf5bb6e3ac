// Max, average and adaptive average pooling, 2d and 3d, schema half: the call from a shape (a
// 2-wide window, stride = kernel, no padding by default; adaptive: a 1x1 output by default; JSON
// overrides each scalar) and its outputs, with ATen's shape checks (pool.h pool_geometry) so a
// call eager would refuse is refused here too. The geometry serves the backward family as well
// (pool_backward.cpp).
#include "evolve/ops/pool.h"

#include <algorithm>

#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }

// An int list argument from JSON: a list as given, a single int as a one-element list.
std::vector<int64_t> list_of(const nlohmann::json& args, const char* name, std::vector<int64_t> dflt) {
  if (!args.contains(name)) return dflt;
  const auto& v = args[name];
  if (v.is_number_integer()) return {v.get<int64_t>()};
  return v.get<std::vector<int64_t>>();
}

Status make_pool(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt)};
  return pool_scalars(op, args, c);
}

// One axis' value of an ATen int list: one value for every axis, or one per axis; an empty list
// is `empty` (stride: the kernel). false when the length fits neither.
bool axis_values(const std::vector<int64_t>& v, int nd, const int64_t* empty, int64_t out[3]) {
  if (v.empty() && empty) {
    for (int a = 0; a < 3; ++a) out[a] = empty[a];
    return true;
  }
  if (v.size() != 1 && v.size() != static_cast<size_t>(nd)) return false;
  for (int a = 0; a < nd; ++a) out[3 - nd + a] = v.size() == 1 ? v[0] : v[a];
  return true;
}

Result<std::vector<TensorMeta>> pool_outputs(const OpCall& c) {
  auto g = pool_geometry(c);
  if (!g.is_ok()) return g.status();
  const TensorMeta& x = c.inputs[0];
  std::vector<int64_t> sizes(x.sizes.begin(), x.sizes.end() - g->nd);
  for (int a = 3 - g->nd; a < 3; ++a) sizes.push_back(g->out[a]);
  std::vector<TensorMeta> out = {dense_meta("out0", sizes, x.dtype)};
  if (g->max && g->indices) out.push_back(dense_meta("out1", sizes, DType::kI64));
  return out;
}

// Kernel, stride, padding, dilation and the average's options; the output sizes from them.
Status window_params(const OpCall& c, PoolGeom& g) {
  const int64_t one[3] = {1, 1, 1};
  if (!axis_values(c.list_arg("kernel_size"), g.nd, nullptr, g.k)) return invalid("kernel_size");
  if (!axis_values(c.list_arg("stride"), g.nd, g.k, g.s)) return invalid("stride");
  if (!axis_values(c.list_arg("padding"), g.nd, nullptr, g.p)) return invalid("padding");
  if (g.max && !axis_values(c.list_arg("dilation"), g.nd, one, g.d)) return invalid("dilation");
  g.ceil = c.int_arg("ceil_mode", 0) != 0;
  if (!g.max) {
    g.count_include_pad = c.int_arg("count_include_pad", 1) != 0;
    const ScalarArg* dv = c.scalar("divisor_override");
    if (dv && std::holds_alternative<int64_t>(dv->value)) {
      g.divisor = std::get<int64_t>(dv->value);
      if (g.divisor == 0) return invalid("divisor_override must not be zero");
    }
  }
  for (int a = 0; a < 3; ++a) {
    if (g.k[a] <= 0 || g.s[a] <= 0 || g.d[a] <= 0) return invalid("kernel, stride and dilation must be positive");
    if (g.p[a] < 0 || g.p[a] > g.k[a] / 2) return invalid("padding must be at most half the kernel");
    g.out[a] = pool_out_size(g.in[a], g.k[a], g.p[a], g.s[a], g.d[a], g.ceil);
    if (g.out[a] < 1) return invalid("pooling output would be empty");
    if (g.k[a] > INT32_MAX || g.s[a] > INT32_MAX || g.d[a] > INT32_MAX) return invalid("pooling sizes must fit int32");
  }
  return Status::ok();
}

// Adaptive: the output sizes (output_size, or the backward's grad_output), the longest windows.
Status adaptive_params(const OpCall& c, PoolGeom& g) {
  std::vector<int64_t> os;
  if (g.backward) {
    const TensorMeta* dy = c.input("grad_output");
    if (!dy || !dy->defined || dy->sizes.size() < static_cast<size_t>(g.nd)) return invalid("grad_output");
    os.assign(dy->sizes.end() - g.nd, dy->sizes.end());
  } else {
    os = c.list_arg("output_size");
    if (os.size() != static_cast<size_t>(g.nd)) return invalid("output_size must have one entry per spatial dim");
  }
  for (int a = 0; a < g.nd; ++a) g.out[3 - g.nd + a] = os[a];
  for (int a = 0; a < 3; ++a) {
    if (g.out[a] < 1) return invalid("adaptive pooling output would be empty");
    if (g.out[a] > INT32_MAX) return invalid("pooling sizes must fit int32");
    g.k[a] = 0;
    for (int64_t o = 0; o < g.out[a]; ++o)
      g.k[a] = std::max(g.k[a], adaptive_end(o, g.in[a], g.out[a]) - adaptive_start(o, g.in[a], g.out[a]));
  }
  return Status::ok();
}

// The backward's grad_output (and indices) have the forward output's sizes.
Status check_grads(const OpCall& c, const PoolGeom& g, const TensorMeta& x) {
  std::vector<int64_t> sizes(x.sizes.begin(), x.sizes.end() - g.nd);
  for (int a = 3 - g.nd; a < 3; ++a) sizes.push_back(g.out[a]);
  const TensorMeta* dy = c.input("grad_output");
  if (!dy || !dy->defined || dy->sizes != sizes) return invalid("grad_output must have the pooling output's sizes");
  if (!g.max) return Status::ok();
  const TensorMeta* idx = c.input("indices");
  if (!idx || !idx->defined || idx->sizes != sizes || idx->dtype != DType::kI64)
    return invalid("indices must be int64 with the pooling output's sizes");
  return Status::ok();
}

}  // namespace

std::optional<PoolOp> pool_op(OpId op) {
  switch (op) {
    case OpId::kMaxPool2d: return PoolOp{PoolKind::kMax, 2, false};
    case OpId::kMaxPool3d: return PoolOp{PoolKind::kMax, 3, false};
    case OpId::kMaxPool2dValues: return PoolOp{PoolKind::kMax, 2, false, false};
    case OpId::kMaxPool3dValues: return PoolOp{PoolKind::kMax, 3, false, false};
    case OpId::kAvgPool2d: return PoolOp{PoolKind::kAvg, 2, false};
    case OpId::kAvgPool3d: return PoolOp{PoolKind::kAvg, 3, false};
    case OpId::kAdaptiveAvgPool2d: return PoolOp{PoolKind::kAdaptive, 2, false};
    case OpId::kAdaptiveAvgPool3d: return PoolOp{PoolKind::kAdaptive, 3, false};
    case OpId::kMaxPool2dBackward: return PoolOp{PoolKind::kMax, 2, true};
    case OpId::kMaxPool3dBackward: return PoolOp{PoolKind::kMax, 3, true};
    case OpId::kAvgPool2dBackward: return PoolOp{PoolKind::kAvg, 2, true};
    case OpId::kAvgPool3dBackward: return PoolOp{PoolKind::kAvg, 3, true};
    case OpId::kAdaptiveAvgPool2dBackward: return PoolOp{PoolKind::kAdaptive, 2, true};
    case OpId::kAdaptiveAvgPool3dBackward: return PoolOp{PoolKind::kAdaptive, 3, true};
    default: return std::nullopt;
  }
}

Status pool_scalars(OpId op, const nlohmann::json& args, OpCall& c) {
  const auto po = pool_op(op);
  if (!po) return invalid("not a pooling op");
  if (po->kind == PoolKind::kAdaptive) {
    if (po->backward) return Status::ok();   // the output size is grad_output's
    std::vector<int64_t> os = list_of(args, "output_size", {1});
    if (os.size() == 1) os.assign(po->nd, os[0]);
    c.scalars = {{"output_size", os}};
    return Status::ok();
  }
  // Defaults as torch.nn.functional passes them: an int for an int[N] argument reaches the
  // operator as N copies (F.max_pool2d's dilation=1 is [1, 1]), so the key matches a real call's.
  const auto each = [&](int64_t v) { return std::vector<int64_t>(po->nd, v); };
  const std::vector<int64_t> k = list_of(args, "kernel_size", each(2));
  c.scalars = {{"kernel_size", k}, {"stride", list_of(args, "stride", k)}, {"padding", list_of(args, "padding", each(0))}};
  if (po->kind == PoolKind::kMax) {
    c.scalars.push_back({"dilation", list_of(args, "dilation", each(1))});
    c.scalars.push_back({"ceil_mode", args.value("ceil_mode", false)});
    return Status::ok();
  }
  c.scalars.push_back({"ceil_mode", args.value("ceil_mode", false)});
  c.scalars.push_back({"count_include_pad", args.value("count_include_pad", true)});
  // divisor_override: None is the string "none" (kernel_cache/key.h), a value is an int.
  if (args.contains("divisor_override") && args["divisor_override"].is_number_integer())
    c.scalars.push_back({"divisor_override", args["divisor_override"].get<int64_t>()});
  else
    c.scalars.push_back({"divisor_override", std::string("none")});
  return Status::ok();
}

int64_t pool_out_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil) {
  const int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil ? stride - 1 : 0);
  int64_t o = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;   // floor division
  if (ceil && (o - 1) * stride >= in + pad) --o;
  return o;
}

void pool_windows_of(const PoolGeom& g, int a, int64_t i, int64_t& lo, int64_t& hi) {
  if (g.adaptive) {
    lo = i * g.out[a] / g.in[a];
    hi = ((i + 1) * g.out[a] + g.in[a] - 1) / g.in[a];
    return;
  }
  const int64_t ext = g.max ? (g.k[a] - 1) * g.d[a] + 1 : g.k[a];
  lo = i + g.p[a] < ext ? 0 : (i + g.p[a] - ext) / g.s[a] + 1;
  hi = std::min((i + g.p[a]) / g.s[a] + 1, g.out[a]);
}

std::vector<int64_t> channels_last_strides(const std::vector<int64_t>& sz) {
  std::vector<int64_t> st(sz.size(), 1);
  if (sz.size() < 3) return st;
  int64_t e = std::max<int64_t>(sz[1], 1);   // C has stride 1; then the spatial dims, last first
  for (size_t a = sz.size() - 1; a >= 2; --a) {
    st[a] = e;
    e *= std::max<int64_t>(sz[a], 1);
  }
  st[0] = e;
  return st;
}

bool channels_last_strided(const TensorMeta& m) {
  if (!m.defined || (m.sizes.size() != 4 && m.sizes.size() != 5)) return false;
  const std::vector<int64_t> st = channels_last_strides(m.sizes);
  for (size_t a = 0; a < st.size(); ++a)
    if (m.sizes[a] != 1 && m.strides[a] != st[a]) return false;
  return true;
}

bool is_channels_last(const TensorMeta& m) { return channels_last_strided(m) && !m.contiguous(); }

void to_channels_last(TensorMeta& m) { m.strides = channels_last_strides(m.sizes); }

Result<PoolGeom> pool_geometry(const OpCall& c) {
  const auto po = pool_op(c.op);
  if (!po) return invalid("not a pooling op");
  PoolGeom g;
  g.max = po->kind == PoolKind::kMax;
  g.indices = g.max && po->indices;
  g.adaptive = po->kind == PoolKind::kAdaptive;
  g.backward = po->backward;
  g.nd = po->nd;
  const TensorMeta* xp = c.input("self");
  if (!xp || !xp->defined) return invalid("pooling needs self");
  const TensorMeta& x = *xp;
  const int nd = static_cast<int>(x.sizes.size());
  if (nd != g.nd + 1 && nd != g.nd + 2) return invalid("pooling input must be (C, spatial) or (N, C, spatial)");
  g.batched = nd == g.nd + 2;
  for (int a = g.batched ? 1 : 0; a < nd; ++a)
    if (x.sizes[a] <= 0) return invalid("pooling input has an empty non-batch dimension");
  g.planes = 1;
  for (int a = 0; a < nd - g.nd; ++a) g.planes *= x.sizes[a];
  for (int a = 0; a < g.nd; ++a) g.in[3 - g.nd + a] = x.sizes[nd - g.nd + a];
  for (int a = 0; a < 3; ++a)
    if (g.in[a] > INT32_MAX) return invalid("pooling sizes must fit int32");
  Status st = g.adaptive ? adaptive_params(c, g) : window_params(c, g);
  if (!st.is_ok()) return st;
  if (g.backward) {
    st = check_grads(c, g, x);
    if (!st.is_ok()) return st;
  }
  return g;
}

extern const FamilySchema kPoolSchema{&make_pool, &pool_outputs};

}  // namespace kc::evolve
