// The numerics stage: reference sets with their error budgets, and the comparison; see numerics.h.
#include "evolve/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>

#include "evolve/eager.h"
#include "runtime/ops.h"

namespace kc::evolve {
namespace {

// Comparisons run over flat chunks of this many elements, so their fp64 temporaries stay a fixed
// few tens of MiB instead of several copies of the output (a 256 MiB key's evaluation child held
// ten such copies at once).
constexpr int64_t kChunk = int64_t{1} << 20;

at::Tensor flat(const at::Tensor& t) { return t.reshape(-1); }

// `mask` narrowed like the chunk when it applies to these elements (same numel), else undefined.
at::Tensor chunk_of(const at::Tensor& mask, int64_t numel, int64_t off, int64_t len) {
  if (!mask.defined() || mask.numel() != numel) return at::Tensor();
  return flat(mask).narrow(0, off, len);
}

}  // namespace

double rel_err(const at::Tensor& x, const at::Tensor& ref, const at::Tensor& r64, double tau, int64_t* where,
               const at::Tensor& care) {
  const int64_t n = x.numel();
  at::Tensor xf = flat(x), rf = flat(ref), r64f = flat(r64);
  double worst = 0;
  int64_t worst_at = 0;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    at::Tensor r = r64f.narrow(0, off, len);
    at::Tensor ok = at::isfinite(rf.narrow(0, off, len)) & at::isfinite(r);
    if (at::Tensor c = chunk_of(care, n, off, len); c.defined()) ok &= c;
    at::Tensor e = (xf.narrow(0, off, len).to(at::kDouble) - r).abs_().div_(r.abs() + tau);
    e.masked_fill_(at::isnan(e), INFINITY);   // candidate NaN where eager is finite
    e.masked_fill_(ok.logical_not(), 0);
    const int64_t i = e.argmax().item<int64_t>();
    const double v = e[i].item<double>();
    if (off == 0 || v > worst) worst = v, worst_at = off + i;
  }
  if (where) *where = worst_at;
  return worst;
}

namespace {

std::vector<int64_t> unflatten(at::IntArrayRef sizes, int64_t flat_index) {
  std::vector<int64_t> idx(sizes.size());
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = sizes[d] ? flat_index % sizes[d] : 0;
    flat_index = sizes[d] ? flat_index / sizes[d] : 0;
  }
  return idx;
}

double value_at(const at::Tensor& t, int64_t flat_index) {
  at::Tensor e = t;
  for (int64_t i : unflatten(t.sizes(), flat_index)) e = e.select(0, i);
  return e.item<double>();
}

std::string index_string(const at::Tensor& t, int64_t flat_index) {
  std::string s = "[";
  auto idx = unflatten(t.sizes(), flat_index);
  for (size_t d = 0; d < idx.size(); ++d) {
    if (d) s += ',';
    s += std::to_string(idx[d]);
  }
  return s + "]";
}

// The flat index of the first element where `bad(off, len)` (a bool chunk) is true, or -1.
template <class F>
int64_t first_where(int64_t n, F bad) {
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    at::Tensor b = bad(off, len);
    if (b.any().item<bool>()) return off + b.nonzero()[0][0].item<int64_t>();
  }
  return -1;
}

}  // namespace

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}

std::optional<nlohmann::json> compare(const std::string& out_name, const at::Tensor& x, const at::Tensor& ref,
                                      const at::Tensor& r64, double budget, double tau, const at::Tensor& care,
                                      const at::Tensor& denormal_in) {
  if (!x.defined() || !ref.defined()) {
    if (x.defined() != ref.defined()) return nlohmann::json{{"output", out_name}, {"error", "output presence differs"}};
    return std::nullopt;
  }
  const int64_t n = x.numel();
  at::Tensor xf = flat(x), rf = flat(ref), r64f = flat(r64);

  // Non-finite values: exactly where eager has them, with the same kind; or where the fp64
  // computation has them (a kernel more exact than eager, e.g. gelu(+inf) = +inf, is not wrong).
  // Only the cared-for elements count (numerics.h InputSet::care).
  int64_t i = first_where(n, [&](int64_t off, int64_t len) {
    at::Tensor xs = xf.narrow(0, off, len);
    auto mismatch = [&](const at::Tensor& r) {
      at::Tensor rr = r.narrow(0, off, len).to(xs.scalar_type());
      at::Tensor ri = at::isinf(rr);
      return (at::isnan(xs) != at::isnan(rr)) | (at::isinf(xs) != ri) | (ri & (xs != rr));
    };
    at::Tensor b = mismatch(rf) & mismatch(r64f);
    if (at::Tensor c = chunk_of(care, n, off, len); c.defined()) b &= c;
    return b;
  });
  if (i >= 0)
    return nlohmann::json{{"output", out_name}, {"check", "non-finite"}, {"index", index_string(ref, i)},
                          {"expected", value_at(ref, i)}, {"actual", value_at(x, i)},
                          {"why", "NaN/Inf where eager has none, or missing where it has them"}};
  // Denormals kept: where a denormal input gives eager a non-zero subnormal, the candidate must
  // not give zero (it flushed the input).
  if (x.scalar_type() == at::kFloat && denormal_in.defined() && denormal_in.numel() == n) {
    i = first_where(n, [&](int64_t off, int64_t len) {
      at::Tensor r = rf.narrow(0, off, len);
      return (r != 0) & (r.abs() < std::numeric_limits<float>::min()) & (xf.narrow(0, off, len) == 0) &
             chunk_of(denormal_in, n, off, len);
    });
    if (i >= 0)
      return nlohmann::json{{"output", out_name}, {"check", "denormal"}, {"index", index_string(ref, i)},
                            {"expected", value_at(ref, i)}, {"actual", 0.0}, {"why", "flushes denormals to zero"}};
  }
  double err = rel_err(x, ref, r64, tau, &i, care);
  if (err > budget) {
    return nlohmann::json{{"output", out_name}, {"check", "error budget"}, {"index", index_string(ref, i)},
                          {"expected", value_at(ref, i)}, {"fp64", value_at(r64, i)}, {"actual", value_at(x, i)},
                          {"error", err}, {"budget", budget}};
  }
  return std::nullopt;
}

namespace {

size_t storage_hash(const at::Tensor& t) {
  const auto& st = t.storage();
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(st.data()), st.nbytes()));
}

}  // namespace

InputGuard::InputGuard(const std::vector<at::Tensor>& inputs) {
  for (const auto& t : inputs) {
    const bool host = t.defined() && t.is_cpu();
    copies_.push_back(t.defined() && !host ? t.clone() : at::Tensor());
    hashes_.push_back(host ? storage_hash(t) : 0);
  }
}

bool InputGuard::unchanged(size_t k, const at::Tensor& now) const {
  if (!now.defined()) return true;
  if (now.is_cpu()) return storage_hash(now) == hashes_[k];
  return same_bits(now, copies_[k]);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const size_t bytes = ac.numel() * ac.element_size();
  if (a.is_cpu()) return std::memcmp(ac.data_ptr(), bc.data_ptr(), bytes) == 0;
  // Compare as bytes on the device; NaN payloads included.
  return at::equal(ac.view(at::kByte), bc.view(at::kByte));
}

namespace {

// Root mean square of the finite elements (non-finite ones count as zero), chunk by chunk.
double finite_rms(const at::Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return 0;
  at::Tensor f = flat(t);
  double sum = 0;
  for (int64_t off = 0; off < n; off += kChunk) {
    at::Tensor c = f.narrow(0, off, std::min(kChunk, n - off)).to(at::kDouble);
    sum += c.masked_fill(at::isfinite(c).logical_not(), 0).square().sum().item<double>();
  }
  return std::sqrt(sum / static_cast<double>(n));
}

// How many input elements are summed into each element of output j: 1 for elementwise ops, the
// row length for softmax and layer norm (every output, statistics included), and for layer norm
// backward the row length for grad_input but the number of rows for grad_weight and grad_bias.
int64_t reduction_length(const OpCall& call, size_t j) {
  const TensorMeta* lead = call.inputs.empty() ? nullptr : &call.inputs.front();
  for (const auto& t : call.inputs)
    if (t.defined && t.numel() > (lead ? lead->numel() : 0)) lead = &t;
  if (!lead || lead->sizes.empty()) return 1;
  switch (op_info(call.op).family) {
    case OpFamily::kUnary:
    case OpFamily::kUnaryBackward: return 1;
    case OpFamily::kSoftmax:
    case OpFamily::kSoftmaxBackward: {
      int64_t d = call.int_arg("dim", -1);
      const int64_t nd = static_cast<int64_t>(lead->sizes.size());
      if (d < 0) d += nd;
      return d >= 0 && d < nd ? std::max<int64_t>(1, lead->sizes[d]) : 1;
    }
    case OpFamily::kLayerNorm:
    case OpFamily::kLayerNormBackward: {
      int64_t n = 1;
      for (int64_t v : call.list_arg("normalized_shape")) n *= std::max<int64_t>(1, v);
      const int64_t rows = std::max<int64_t>(1, lead->numel() / std::max<int64_t>(1, n));
      return op_info(call.op).family == OpFamily::kLayerNormBackward && j > 0 ? rows : n;
    }
  }
  return 1;
}

}  // namespace

Result<InputSet> reference_set(const OpCall& call, const std::string& name, std::vector<at::Tensor> inputs) {
  InputSet s;
  s.name = name;
  s.inputs = std::move(inputs);
  s.ref = run_eager(call, s.inputs);
  s.ref64 = run_fp64(call, s.inputs);
  if (op_info(call.op).family == OpFamily::kUnary || op_info(call.op).family == OpFamily::kUnaryBackward)
    for (const auto& t : s.inputs)
      if (t.defined() && t.scalar_type() == at::kFloat) {
        at::Tensor d = (t != 0) & (t.abs() < std::numeric_limits<float>::min());
        s.denormal_in = s.denormal_in.defined() && s.denormal_in.sizes() == d.sizes() ? (s.denormal_in | d) : d;
      }
  if (name == "special")
    for (const auto& t : s.inputs)
      if (t.defined() && t.is_floating_point()) {
        at::Tensor fin = at::isfinite(t);
        s.care = s.care.defined() && s.care.sizes() == fin.sizes() ? (s.care & fin) : fin;
      }
  if (s.ref.size() != call.outputs.size())
    return Status::error(Code::kInvalid, "eager returned " + std::to_string(s.ref.size()) + " outputs");
  for (size_t j = 0; j < s.ref.size(); ++j) {
    const TensorMeta& m = call.outputs[j];
    if (s.ref[j].defined() != m.defined ||
        (m.defined && (s.ref[j].sizes().vec() != m.sizes || s.ref[j].strides().vec() != m.strides)))
      return Status::error(Code::kInvalid, "eager's output " + m.name + " differs from the inferred layout");
    double tau = 0, err = 0;
    if (m.defined) {
      const at::Tensor& r64 = s.ref64[j];
      const double rms = finite_rms(r64);
      // Mixed error: relative for large values, absolute at a tenth of the typical magnitude
      // near zero (a formula that loses a few ulp of 1.0 at tiny outputs is not wrong).
      tau = std::max(1e-1 * rms, 1e-30);
      err = rel_err(s.ref[j], s.ref[j], r64, tau, nullptr, at::Tensor());
    }
    double eps = m.dtype == DType::kF64 ? 2.2e-16 : m.dtype == DType::kF32 ? 1.19e-7 : 7.8e-3;
    // Opt-in reduced precision (the key's policy) for fp32 outputs: the unit roundoff of bf16
    // (8 significant bits) or tf32 (11).
    if (m.dtype == DType::kF32 && call.policy == "bf16") eps = 3.9e-3;
    if (m.dtype == DType::kF32 && call.policy == "tf32") eps = 4.9e-4;
    s.tau.push_back(tau);
    s.eager_err.push_back(err);
    // The candidate may be a few times less exact than eager, never less than a few ulp of room.
    // Reductions also get the error growth of plain accumulation in the output's precision: a
    // sequential fp32 sum of K terms is typically sqrt(K) roundings off, where eager's own blocked
    // or Welford sums are not (measured: a naive two-pass fp32 layer norm was 3-43x eager's error
    // for rows of 768 to 65,536). Accumulating in fp16/bf16 or skipping work stays far outside.
    const double growth = std::max(1.0, std::sqrt(static_cast<double>(reduction_length(call, j))) / 8.0);
    s.budget.push_back(std::max(4 * err, 16 * eps) * growth);
  }
  return s;
}

}  // namespace kc::evolve
