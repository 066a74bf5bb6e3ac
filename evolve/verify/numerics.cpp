// The numerics stage: reference sets with their error budgets, and the comparison; see numerics.h.
#include "evolve/verify/numerics.h"
#include "evolve/ops/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>

#include "evolve/ops/eager.h"
#include "runtime/ops.h"

namespace kc::evolve {
namespace {

// Comparisons run over flat chunks of this many elements, so their fp64 temporaries stay a fixed
// few tens of MiB instead of several copies of the output (a 256 MiB key's evaluation child held
// ten such copies at once).
constexpr int64_t kChunk = kNumericsChunk;

at::Tensor flat(const at::Tensor& t) { return t.reshape(-1); }

// `mask` narrowed like the chunk when it applies to these elements (same numel), else undefined.
at::Tensor chunk_of(const at::Tensor& mask, int64_t numel, int64_t off, int64_t len) {
  if (!mask.defined() || mask.numel() != numel) return at::Tensor();
  return flat(mask).narrow(0, off, len);
}

// max_i |x - r64| / scale(off, len, r64 chunk) over the compared elements (eager and fp64 finite,
// `care` where defined), chunk by chunk; *where gets the flat index of the maximum. A NaN
// candidate where eager is finite counts as infinitely far. rel_err's and tol_ratio's one loop.
template <class Scale>
double worst_scaled_error(const at::Tensor& x, const at::Tensor& ref, const at::Tensor& r64, const at::Tensor& care,
                          int64_t* where, Scale scale) {
  const int64_t n = x.numel();
  at::Tensor xf = flat(x), rf = flat(ref), r64f = flat(r64);
  double worst = 0;
  int64_t worst_at = 0;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    at::Tensor r = r64f.narrow(0, off, len);
    at::Tensor ok = at::isfinite(rf.narrow(0, off, len)) & at::isfinite(r);
    if (at::Tensor c = chunk_of(care, n, off, len); c.defined()) ok &= c;
    at::Tensor e = (xf.narrow(0, off, len).to(at::kDouble) - r).abs_().div_(scale(off, len, r));
    e.masked_fill_(at::isnan(e), INFINITY);
    e.masked_fill_(ok.logical_not(), 0);
    const int64_t i = e.argmax().item<int64_t>();
    const double v = e[i].item<double>();
    if (off == 0 || v > worst) worst = v, worst_at = off + i;
  }
  if (where) *where = worst_at;
  return worst;
}

}  // namespace

double rel_err(const at::Tensor& x, const at::Tensor& ref, const at::Tensor& r64, double tau, int64_t* where,
               const at::Tensor& care) {
  return worst_scaled_error(x, ref, r64, care, where,
                            [tau](int64_t, int64_t, const at::Tensor& r) { return r.abs() + tau; });
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

namespace {

// max_i |x - r64| / tol over the compared elements (eager and fp64 finite, `care`); the flat index
// of the maximum in *where. A NaN candidate where eager is finite counts as infinitely far.
double tol_ratio(const at::Tensor& x, const InputSet& set, size_t j, const at::Tensor& tol, int64_t* where) {
  at::Tensor tf = flat(tol);
  return worst_scaled_error(x, set.ref[j], set.ref64[j], set.care, where,
                            [&tf](int64_t off, int64_t len, const at::Tensor&) { return tf.narrow(0, off, len).to(at::kDouble); });
}

// The tolerance of a set without one (budget * (|r64| + tau)), chunk by chunk into a float32 tensor.
at::Tensor scalar_tolerance(const at::Tensor& r64, double budget, double tau) {
  at::Tensor t = at::empty(r64.sizes(), r64.options().dtype(at::kFloat));
  at::Tensor tf = flat(t), rf = flat(r64);
  for (int64_t off = 0; off < rf.numel(); off += kChunk) {
    const int64_t len = std::min(kChunk, rf.numel() - off);
    tf.narrow(0, off, len).copy_(rf.narrow(0, off, len).abs().add_(tau).mul_(budget));
  }
  return t;
}

}  // namespace

std::optional<nlohmann::json> compare(const std::string& out_name, const at::Tensor& x, const InputSet& set,
                                      size_t j) {
  const at::Tensor& ref = set.ref[j];
  const at::Tensor& r64 = set.ref64[j];
  if (!x.defined() || !ref.defined()) {
    if (x.defined() != ref.defined()) return nlohmann::json{{"output", out_name}, {"error", "output presence differs"}};
    return std::nullopt;
  }
  const at::Tensor& care = set.care;
  const at::Tensor& denormal_in = set.denormal_in;
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
  const double tau = j < set.tau.size() ? set.tau[j] : 0;
  const double budget = j < set.budget.size() ? set.budget[j] : 0;
  at::Tensor tol = j < set.tol.size() && set.tol[j].defined() ? set.tol[j] : scalar_tolerance(r64, budget, tau);
  const double ratio = tol_ratio(x, set, j, tol, &i);
  if (ratio > 1) {
    const double fp64 = value_at(r64, i), actual = value_at(x, i);
    return nlohmann::json{{"output", out_name}, {"check", "error budget"}, {"index", index_string(ref, i)},
                          {"expected", value_at(ref, i)}, {"fp64", fp64}, {"actual", actual},
                          {"abs_error", std::fabs(actual - fp64)}, {"allowed", value_at(tol, i)}, {"ratio", ratio},
                          {"error", std::fabs(actual - fp64) / (std::fabs(fp64) + tau)}, {"budget", budget}};
  }
  if (j < set.worst.size()) set.worst[j] = std::max(set.worst[j], ratio);
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
  // Compare as bytes on the device; NaN payloads included. Flattened first: a 0-dim tensor (a
  // loss's mean) cannot be viewed as bytes, and once threw here for every such CUDA key.
  return at::equal(ac.reshape(-1).view(at::kByte), bc.reshape(-1).view(at::kByte));
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

}  // namespace

Result<InputSet> reference_set(const OpCall& call, const std::string& name, std::vector<at::Tensor> inputs) {
  InputSet s;
  s.name = name;
  s.inputs = std::move(inputs);
  s.ref = run_eager(call, s.inputs);
  s.ref64 = run_fp64(call, s.inputs);
  if (!family_reference(op_info(call.op).family).layout)   // elementwise: no reduction model
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
    s.tau.push_back(tau);
    s.eager_err.push_back(err);
  }
  attach_tolerance(call, s);
  return s;
}

}  // namespace kc::evolve
