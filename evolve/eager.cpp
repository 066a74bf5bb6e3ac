// Eager references and input generation for the intercepted operators.
#include "evolve/eager.h"

#include <algorithm>
#include <cstdint>

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

namespace {

at::Scalar threshold_of(const OpCall& c) {
  const ScalarArg* s = c.scalar("threshold");
  if (s && std::holds_alternative<double>(s->value)) return at::Scalar(std::get<double>(s->value));
  return at::Scalar(c.int_arg("threshold", 0));
}

std::vector<at::Tensor> list(at::Tensor t) { return {std::move(t)}; }
std::vector<at::Tensor> list(std::tuple<at::Tensor, at::Tensor, at::Tensor> t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t)};
}

std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace

std::vector<at::Tensor> run_eager(const OpCall& c, const std::vector<at::Tensor>& in) {
  const std::string approx = c.string_arg("approximate", "none");
  switch (c.op) {
    case OpId::kRelu: return list(at::relu(in[0]));
    case OpId::kGelu: return list(at::gelu(in[0], approx));
    case OpId::kSilu: return list(at::silu(in[0]));
    case OpId::kSigmoid: return list(at::sigmoid(in[0]));
    case OpId::kTanh: return list(at::tanh(in[0]));
    case OpId::kSoftmax: return list(at::_softmax(in[0], c.int_arg("dim", -1), c.int_arg("half_to_float", 0)));
    case OpId::kLogSoftmax:
      return list(at::_log_softmax(in[0], c.int_arg("dim", -1), c.int_arg("half_to_float", 0)));
    case OpId::kLayerNorm:
      return list(at::native_layer_norm(in[0], c.list_arg("normalized_shape"), opt(in[1]), opt(in[2]),
                                        c.double_arg("eps", 1e-5)));
    case OpId::kReluBackward: return list(at::threshold_backward(in[0], in[1], threshold_of(c)));
    case OpId::kGeluBackward: return list(at::gelu_backward(in[0], in[1], approx));
    case OpId::kSiluBackward: return list(at::silu_backward(in[0], in[1]));
    case OpId::kSigmoidBackward: return list(at::sigmoid_backward(in[0], in[1]));
    case OpId::kTanhBackward: return list(at::tanh_backward(in[0], in[1]));
    case OpId::kSoftmaxBackward:
      return list(at::_softmax_backward_data(in[0], in[1], c.int_arg("dim", -1), in[1].scalar_type()));
    case OpId::kLogSoftmaxBackward:
      return list(at::_log_softmax_backward_data(in[0], in[1], c.int_arg("dim", -1), in[1].scalar_type()));
    case OpId::kLayerNormBackward: {
      auto m = c.list_arg("output_mask");
      std::array<bool, 3> mask = {m.size() > 0 && m[0], m.size() > 1 && m[1], m.size() > 2 && m[2]};
      return list(at::native_layer_norm_backward(in[0], in[1], c.list_arg("normalized_shape"), in[2], in[3],
                                                 opt(in[4]), opt(in[5]), mask));
    }
    case OpId::kCount: break;
  }
  return {};
}

std::vector<at::Tensor> run_fp64(const OpCall& c, const std::vector<at::Tensor>& in) {
  std::vector<at::Tensor> d;
  for (const auto& t : in) d.push_back(t.defined() && t.is_floating_point() ? t.to(at::kDouble) : t);
  return run_eager(c, d);
}

const std::vector<std::string>& input_kinds(OpId op) {
  static const std::vector<std::string> elementwise = {"normal", "large", "offset", "extreme", "special"};
  static const std::vector<std::string> reduction = {"normal", "large", "offset", "extreme"};
  switch (op_info(op).family) {
    case OpFamily::kUnary:
    case OpFamily::kUnaryBackward: return elementwise;
    default: return reduction;
  }
}

namespace {

at::Tensor values(const TensorMeta& m, const std::string& kind, at::Generator& g, at::Device dev, OpId op) {
  auto opts = at::TensorOptions().dtype(to_scalar_type(m.dtype)).device(dev);
  at::Tensor base = at::empty(m.sizes, opts.dtype(at::kFloat).device(at::kCPU));
  base.normal_(0, 1, g);
  const OpFamily fam = op_info(op).family;
  if (kind == "large") {
    base.mul_(fam == OpFamily::kSoftmax ? 1e4 : 1e3);
  } else if (kind == "offset") {
    base.add_(fam == OpFamily::kLayerNorm || fam == OpFamily::kLayerNormBackward ? 100.0 : 3.0);
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
  auto fwd_of = [&](const TensorMeta& m, at::Tensor x) {
    at::Tensor y;
    switch (c.op) {
      case OpId::kSigmoidBackward: y = at::sigmoid(x); break;
      case OpId::kTanhBackward: y = at::tanh(x); break;
      case OpId::kSoftmaxBackward: y = at::_softmax(x, c.int_arg("dim", -1), false); break;
      case OpId::kLogSoftmaxBackward: y = at::_log_softmax(x, c.int_arg("dim", -1), false); break;
      default: return x;
    }
    at::Tensor out = empty_like_meta(m, dev);
    out.copy_(y);
    return out;
  };
  switch (c.op) {
    case OpId::kSigmoidBackward: case OpId::kTanhBackward: case OpId::kSoftmaxBackward: case OpId::kLogSoftmaxBackward:
      in[1] = fwd_of(c.inputs[1], in[1]);
      break;
    case OpId::kLayerNormBackward: {
      auto stats = at::native_layer_norm(in[1], c.list_arg("normalized_shape"), opt(in[4]), opt(in[5]), 1e-5);
      in[2].copy_(std::get<1>(stats).view(in[2].sizes()));
      in[3].copy_(std::get<2>(stats).view(in[3].sizes()));
      break;
    }
    default: break;
  }
  return in;
}

}  // namespace kc::evolve
