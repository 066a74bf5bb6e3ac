// Eager references and input generation for the intercepted operators: the families' homes
// (evolve/ops/) hold what is particular to each; this is what they share.
#include "evolve/ops/eager.h"

#include "evolve/ops/reference.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace kc::evolve {

at::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::kF32: return at::kFloat;
    case DType::kF64: return at::kDouble;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kI64: return at::kLong;
    case DType::kI32: return at::kInt;
    case DType::kI8: return at::kChar;
    case DType::kU8: return at::kByte;
    case DType::kBool: return at::kBool;
    case DType::kOther: break;
  }
  return at::kFloat;
}

at::Tensor empty_like_meta(const TensorMeta& m, at::Device dev) {
  if (!m.defined) return at::Tensor();
  auto opts = at::TensorOptions().dtype(to_scalar_type(m.dtype)).device(dev);
  const int64_t es = static_cast<int64_t>(dtype_size(m.dtype));
  const int64_t a = std::clamp(m.align, 1, kMaxAlignClass);
  // A start of exactly class `a` is a multiple of kAlignSpan plus a; a storage offset can express
  // that only in whole elements (a class below the element size cannot occur for real tensors).
  if (a % es != 0) return at::empty_strided(m.sizes, m.strides, opts);
  const int64_t span = kAlignSpan / es;
  at::Tensor buf = at::empty({extent_bytes(m) / es + span}, opts);
  const auto base = reinterpret_cast<uintptr_t>(buf.data_ptr());
  for (int64_t off = 0; off < span; ++off)
    if ((base + static_cast<uintptr_t>(off * es)) % kAlignSpan == static_cast<uintptr_t>(a % kAlignSpan))
      return buf.as_strided(m.sizes, m.strides, off);
  return at::empty_strided(m.sizes, m.strides, opts);
}

std::vector<at::Tensor> run_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  return family_reference(op_info(c.op).family).eager(c, in);
}

void run_eager_timed(const OpCall& c, const std::vector<at::Tensor>& in) {
  const FamilyReference& f = family_reference(op_info(c.op).family);
  if (f.timed) f.timed(c, in);
  else f.eager(c, in);
}

std::vector<at::Tensor> run_fp64(const OpCall& c, const std::vector<at::Tensor>& in) {
  std::vector<at::Tensor> d;
  for (const auto& t : in) d.push_back(t.defined() && t.is_floating_point() ? t.to(at::kDouble) : t);
  return run_eager(c, d);
}

const std::vector<std::string>& input_kinds(OpId op) { return *family_reference(op_info(op).family).kinds; }

namespace {

// N(0, 1) values into `base` (fp32, CPU). Up to kSerialDraw elements they come from `g` in order.
// A larger tensor (a vocabulary's logits: a billion values, seconds of a serial draw per input
// set, and keys that large rebuild their sets for every candidate) is drawn in chunks in parallel,
// each from its own generator seeded by g's next draws: still a function of the seed alone, the
// same on every machine and device.
void draw_normal(at::Tensor& base, at::Generator& g) {
  constexpr int64_t kSerialDraw = int64_t{1} << 22;
  const int64_t n = base.numel();
  if (n <= kSerialDraw) {
    base.normal_(0, 1, g);
    return;
  }
  const int64_t chunks = (n + kSerialDraw - 1) / kSerialDraw;
  std::vector<uint64_t> seeds(static_cast<size_t>(chunks));
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    auto* impl = g.get<at::CPUGeneratorImpl>();
    for (auto& s : seeds) s = impl->random64();
  }
  at::Tensor flat = base.view(-1);
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      auto gi = at::make_generator<at::CPUGeneratorImpl>(seeds[static_cast<size_t>(i)]);
      flat.narrow(0, i * kSerialDraw, std::min(kSerialDraw, n - i * kSerialDraw)).normal_(0, 1, gi);
    }
  });
}

at::Tensor values(const TensorMeta& m, const std::string& kind, at::Generator& g, at::Device dev, OpId op) {
  auto opts = at::TensorOptions().dtype(to_scalar_type(m.dtype)).device(dev);
  if (!at::isFloatingType(to_scalar_type(m.dtype))) {
    // Integer inputs (class indices) take no float kind: uniform integers in [0, 2^30) from the
    // set's generator, the same draw for every kind; the family's derive maps them to the values
    // its op accepts (nll: a class or ignore_index).
    at::Tensor r = at::empty(m.sizes, at::TensorOptions().dtype(at::kLong)).random_(0, int64_t{1} << 30, g);
    at::Tensor out = at::empty_strided(m.sizes, m.strides, opts);
    out.copy_(r);
    return out;
  }
  at::Tensor base = at::empty(m.sizes, opts.dtype(at::kFloat).device(at::kCPU));
  draw_normal(base, g);
  const FamilyReference& fam = family_reference(op_info(op).family);
  if (kind == "large") {
    base.mul_(fam.large_scale);
  } else if (kind == "offset") {
    base.add_(fam.offset);
  } else if (kind == "extreme") {
    // A repeating pattern of denormals, tiny, huge and signed zeros over the normal values.
    const float pattern[] = {1e-40f, -3e-39f, 1e-30f, 0.0f, -0.0f, 88.0f, -88.0f, 1e4f, -1e4f, 1e-7f};
    auto flat = base.view(-1);
    auto* p = flat.data_ptr<float>();
    for (int64_t i = 0; i < flat.numel(); i += 3) p[i] = pattern[(i / 3) % 10];
  } else if (kind == "special") {
    auto flat = base.view(-1);
    auto* p = flat.data_ptr<float>();
    const float sp[] = {INFINITY, -INFINITY, NAN};
    for (int64_t i = 7; i < flat.numel(); i += 97) p[i] = sp[(i / 97) % 3];
  }
  at::Tensor out = at::empty_strided(m.sizes, m.strides, opts);
  out.copy_(base.to(to_scalar_type(m.dtype)));
  return out;
}

}  // namespace

std::vector<at::Tensor> make_inputs(const OpCall& c, const std::string& kind, uint64_t seed, at::Device dev) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> in;
  for (const auto& m : c.inputs) in.push_back(m.defined ? values(m, kind, g, dev, c.op) : at::Tensor());
  // Inputs that come from the forward pass in training are derived from it, so they are consistent.
  if (auto derive = family_reference(op_info(c.op).family).derive) derive(c, in, dev);
  return in;
}

}  // namespace kc::evolve
