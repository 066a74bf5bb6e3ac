// Reductions, schema half: the call from a shape (the last dim by default; JSON overrides "dim"
// with an int, a list or "none", "keepdim", "dtype", "correction", "ord") and its outputs, with
// ATen's dim checks (reduce_geometry) so a call eager refuses is refused here too.
#include "evolve/ops/reduction.h"

#include <cmath>

#include "evolve/ops/family.h"

namespace kc::evolve {

ReduceKind reduce_kind(OpId op) {
  switch (op) {
    case OpId::kMean: return ReduceKind::kMean;
    case OpId::kAmax: return ReduceKind::kMax;
    case OpId::kAmin: return ReduceKind::kMin;
    case OpId::kArgmax: return ReduceKind::kArgMax;
    case OpId::kArgmin: return ReduceKind::kArgMin;
    case OpId::kVar: return ReduceKind::kVar;
    case OpId::kStd: return ReduceKind::kStd;
    case OpId::kVarMean: return ReduceKind::kVarMean;
    case OpId::kStdMean: return ReduceKind::kStdMean;
    case OpId::kVectorNorm: return ReduceKind::kNorm;
    case OpId::kMax: return ReduceKind::kMaxDim;
    case OpId::kMin: return ReduceKind::kMinDim;
    case OpId::kProd: return ReduceKind::kProd;
    case OpId::kLogsumexp: return ReduceKind::kLogSumExp;
    default: return ReduceKind::kSum;
  }
}

namespace {

Status invalid(const std::string& m) { return Status::error(Code::kInvalid, m); }

// The dims argument as written: an int (argmax), a list, or absent ("none": every dim).
std::vector<int64_t> dims_of(const OpCall& c, bool& all) {
  const ScalarArg* a = c.scalar("dim");
  all = !a || std::holds_alternative<std::string>(a->value);
  if (all) return {};
  if (auto* i = std::get_if<int64_t>(&a->value)) return {*i};
  auto v = c.list_arg("dim");
  all = v.empty();   // an empty list reduces every dim, as in ATen
  return v;
}

// Marks the reduced dims of x (ATen's wrap and duplicate checks).
Status mark_dims(const OpCall& c, const TensorMeta& x, ReduceGeom& g) {
  const int64_t nd = static_cast<int64_t>(x.sizes.size());
  bool all = false;
  const std::vector<int64_t> dims = dims_of(c, all);
  g.reduced.assign(nd, all);
  for (int64_t d : dims) {
    const int64_t lim = std::max<int64_t>(nd, 1);
    if (d < -lim || d >= lim) return invalid("dim " + std::to_string(d) + " out of range");
    if (d < 0) d += lim;
    if (nd == 0) continue;   // a rank-0 input reduces over nothing
    if (g.reduced[d]) return invalid("dim " + std::to_string(d) + " repeated");
    g.reduced[d] = true;
  }
  const bool keep = c.int_arg("keepdim", 0) != 0;
  g.out_sizes.clear();
  for (int64_t d = 0; d < nd; ++d)
    if (!g.reduced[d]) g.out_sizes.push_back(x.sizes[d]);
    else if (keep) g.out_sizes.push_back(1);
  return Status::ok();
}

// [outer, r, inner] over the dims of size > 1, when the reduced ones are one run of them.
void find_block(const TensorMeta& x, ReduceGeom& g) {
  int runs = 0;
  bool in_run = false;
  g.outer = g.r = g.inner = 1;
  for (size_t d = 0; d < x.sizes.size(); ++d) {
    if (x.sizes[d] <= 1) continue;
    if (g.reduced[d]) {
      if (!in_run) ++runs;
      in_run = true;
      g.r *= x.sizes[d];
    } else {
      in_run = false;
      (runs == 0 ? g.outer : g.inner) *= x.sizes[d];
    }
  }
  g.block = runs <= 1;
  for (size_t d = 0; d < x.sizes.size(); ++d)
    if (x.sizes[d] == 0) g.outer = 0;   // an empty input: nothing for a kernel to do
}

// [r1, mid, r2] over the dims of size > 1: reduced, kept, reduced, each one run of them.
void find_two_runs(const TensorMeta& x, ReduceGeom& g) {
  std::vector<std::pair<bool, int64_t>> runs;   // (reduced, product of sizes), adjacent dims merged
  for (size_t d = 0; d < x.sizes.size(); ++d) {
    if (x.sizes[d] <= 1) continue;
    if (!runs.empty() && runs.back().first == g.reduced[d]) runs.back().second *= x.sizes[d];
    else runs.emplace_back(g.reduced[d], x.sizes[d]);
  }
  if (runs.size() != 3 || !runs[0].first) return;
  g.two_runs = true;
  g.r1 = runs[0].second, g.mid = runs[1].second, g.r2 = runs[2].second;
}

Status norm_order(const OpCall& c, ReduceGeom& g) {
  const double ord = c.double_arg("ord", 2.0);
  if (std::isinf(ord)) g.ord = ord > 0 ? NormOrd::kInf : NormOrd::kNegInf;
  else if (ord > 0) g.p = ord;
  else return Status::error(Code::kUnsupported, "vector norm order " + std::to_string(ord));
  return Status::ok();
}

}  // namespace

Result<ReduceGeom> reduce_geometry(const OpCall& c) {
  if (c.inputs.empty() || !c.inputs[0].defined) return invalid("reduction without an input");
  const TensorMeta& x = c.inputs[0];
  ReduceGeom g;
  g.kind = reduce_kind(c.op);
  if (g.kind == ReduceKind::kLogSumExp) {
    const ScalarArg* a = c.scalar("dim");
    if (!a || !std::holds_alternative<std::vector<int64_t>>(a->value) || c.list_arg("dim").empty())
      return Status::error(Code::kUnsupported, "logsumexp without a dim list");
  }
  Status s = mark_dims(c, x, g);
  if (!s.is_ok()) return s;
  find_block(x, g);
  if (!g.block && g.outer > 0) find_two_runs(x, g);
  int64_t reduced = 1;
  for (size_t d = 0; d < x.sizes.size(); ++d)
    if (g.reduced[d]) reduced *= x.sizes[d];
  const bool picks = g.kind == ReduceKind::kMax || g.kind == ReduceKind::kMin || indexed(g.kind);
  if (picks && reduced == 0) return invalid("an empty reduction has no maximum or minimum");
  if (const ScalarArg* a = c.scalar("correction"); a && !std::holds_alternative<std::string>(a->value))
    g.correction = c.double_arg("correction", 1.0);
  if (g.kind == ReduceKind::kNorm) {
    s = norm_order(c, g);
    if (!s.is_ok()) return s;
  }
  return g;
}

namespace {

// The dims argument from JSON: an int, a list, or "none"; `as_int` for argmax's optional int.
ScalarValue dim_value(const nlohmann::json& args, bool as_int) {
  if (!args.contains("dim")) return as_int ? ScalarValue{int64_t{-1}} : ScalarValue{std::vector<int64_t>{-1}};
  const auto& v = args["dim"];
  if (v.is_string()) return std::string("none");
  if (v.is_number_integer()) return as_int ? ScalarValue{v.get<int64_t>()} : ScalarValue{std::vector<int64_t>{v.get<int64_t>()}};
  return v.get<std::vector<int64_t>>();
}

ScalarValue number_or_none(const nlohmann::json& args, const char* name) {
  if (!args.contains(name) || args[name].is_string()) return std::string("none");
  if (args[name].is_number_integer()) return args[name].get<int64_t>();
  return args[name].get<double>();
}

// Scalars in schema order: sum/mean (dim, keepdim, dtype), amax/amin/logsumexp (dim, keepdim),
// argmax/argmin and max/min.dim (dim, keepdim), prod.dim_int (dim, keepdim, dtype), var family
// (dim, correction, keepdim), norm (ord, dim, keepdim, dtype).
Status make_reduction(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt)};
  const ReduceKind k = reduce_kind(op);
  const bool one_dim = k == ReduceKind::kMaxDim || k == ReduceKind::kMinDim || k == ReduceKind::kProd;
  if (one_dim && args.contains("dim") && !args["dim"].is_number_integer())
    return Status::error(Code::kInvalid, std::string(op_info(op).name) + " takes one int dim");
  const bool keep = args.value("keepdim", false);
  const ScalarArg dtype{"dtype", args.value("dtype", std::string("none"))};
  switch (k) {
    case ReduceKind::kSum:
    case ReduceKind::kMean: c.scalars = {{"dim", dim_value(args, false)}, {"keepdim", keep}, dtype}; break;
    case ReduceKind::kMax:
    case ReduceKind::kMin:
    case ReduceKind::kLogSumExp: c.scalars = {{"dim", dim_value(args, false)}, {"keepdim", keep}}; break;
    case ReduceKind::kArgMax:
    case ReduceKind::kArgMin:
    case ReduceKind::kMaxDim:
    case ReduceKind::kMinDim: c.scalars = {{"dim", dim_value(args, true)}, {"keepdim", keep}}; break;
    case ReduceKind::kProd: c.scalars = {{"dim", dim_value(args, true)}, {"keepdim", keep}, dtype}; break;
    case ReduceKind::kNorm: {
      ScalarValue ord = number_or_none(args, "ord");
      if (std::holds_alternative<std::string>(ord)) ord = int64_t{2};
      c.scalars = {{"ord", ord}, {"dim", dim_value(args, false)}, {"keepdim", keep}, dtype};
      break;
    }
    default:
      c.scalars = {{"dim", dim_value(args, false)}, {"correction", number_or_none(args, "correction")}, {"keepdim", keep}};
  }
  return Status::ok();
}

bool floating(DType d) { return d == DType::kF32 || d == DType::kF64 || d == DType::kF16 || d == DType::kBF16; }

// Output 0's dtype: int64 for argmax / argmin, the requested dtype (sum, mean, norm, prod) or the
// input's (max / min.dim's values; their indices are output 1, int64).
Result<DType> out_dtype(const OpCall& c, ReduceKind k) {
  const DType x = c.inputs[0].dtype;
  if (k == ReduceKind::kArgMax || k == ReduceKind::kArgMin) return DType::kI64;
  const std::string want = c.string_arg("dtype", "none");
  if (want != "none") {
    auto d = dtype_from_name(want);
    if (!d) return Status::error(Code::kUnsupported, "dtype " + want);
    return *d;
  }
  // Integer (and bool) sums and products widen, as in ATen.
  if ((k == ReduceKind::kSum || k == ReduceKind::kProd) && !floating(x)) return DType::kI64;
  if (!floating(x)) return Status::error(Code::kUnsupported, "a reduction of a non-float input");
  return x;
}

Result<std::vector<TensorMeta>> reduction_outputs(const OpCall& c) {
  auto g = reduce_geometry(c);
  if (!g.is_ok()) return g.status();
  auto dt = out_dtype(c, g->kind);
  if (!dt.is_ok()) return dt.status();
  std::vector<TensorMeta> out = {dense_meta("out0", g->out_sizes, dt.value())};
  if (g->kind == ReduceKind::kVarMean || g->kind == ReduceKind::kStdMean)
    out.push_back(dense_meta("out1", g->out_sizes, dt.value()));
  if (g->kind == ReduceKind::kMaxDim || g->kind == ReduceKind::kMinDim)
    out.push_back(dense_meta("out1", g->out_sizes, DType::kI64));
  return out;
}

}  // namespace

extern const FamilySchema kReductionSchema{&make_reduction, &reduction_outputs};

}  // namespace kc::evolve
