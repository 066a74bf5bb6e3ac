// CUDA elementwise templates: unary operators and their backward (cuda.unary, cuda.unary_backward).
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h.
#include "evolve/propose/templates_cuda_common.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Elementwise: out = f(a) or f(grad, b). Each thread handles `unroll` vectors of `vec` elements a
// tile (coalesced: vector u of thread t is t + u * block), full tiles without bounds checks, the
// elements after the last whole vector by block 0.

struct EwOp {
  const char* entry;
  // float kc_op(float a, float b, float p, float q, float r): a = self / grad, b = the 2nd input,
  // p, q, r = the op's scalars (in float, as eager's opmath).
  std::string body;
  const char* second;                 // name of the second input (nullptr for unary ops)
  std::vector<const char*> params;    // up to 3 scalar names (launch args "f32:<name>")
};

const char* kGeluTanhBody =
    "const float kB = 0.79788456080286535588f, kK = 0.044715f; const float a3 = a * a * a;"
    " const float inner = kB * (a + kK * a3); return 0.5f * a * (1.f + tanhf(inner));";
const char* kGeluTanhBackBody =
    "const float kB = 0.79788456080286535588f, kK = 0.044715f; const float x2 = b * b, x3 = x2 * b;"
    " const float th = tanhf(kB * (b + kK * x3)); const float left = 0.5f * b, right = 1.f + th;"
    " const float left_d = 0.5f * right, th_d = 1.f - th * th;"
    " const float inner_d = kB * (1.f + 3.f * kK * x2); const float right_d = left * th_d * inner_d;"
    " return a * (left_d + right_d);";

// The forward ops. Comparisons and NaN handling follow eager's CUDA kernels (fminf/fmaxf where
// eager's std::min/std::max are, an explicit NaN pass-through where eager's clamp has one).
EwOp ew_forward(const OpCall& c) {
  const std::string approx = c.string_arg("approximate", "none");
  switch (c.op) {
    case OpId::kRelu: return {"kc_relu", "return (a > 0.f || a != a) ? a : 0.f;", nullptr, {}};
    case OpId::kGelu:
      if (approx == "none")
        return {"kc_gelu", "return a * 0.5f * (1.f + erff(a * 0.70710678118654752440f));", nullptr, {}};
      if (approx == "tanh") return {"kc_gelu_tanh", kGeluTanhBody, nullptr, {}};
      return {nullptr, "", nullptr, {}};
    case OpId::kSilu: return {"kc_silu", "return a / (1.f + expf(-a));", nullptr, {}};
    case OpId::kSigmoid: return {"kc_sigmoid", "return 1.f / (1.f + expf(-a));", nullptr, {}};
    case OpId::kTanh: return {"kc_tanh", "return tanhf(a);", nullptr, {}};
    case OpId::kLeakyRelu: return {"kc_leaky_relu", "return a > 0.f ? a : a * p;", nullptr, {"negative_slope"}};
    case OpId::kElu:
      return {"kc_elu", "return a > 0.f ? a * q : expm1f(a * r) * (p * q);", nullptr, {"alpha", "scale", "input_scale"}};
    case OpId::kHardtanh: return {"kc_hardtanh", "return a != a ? a : fminf(fmaxf(a, p), q);", nullptr, {"min_val", "max_val"}};
    case OpId::kHardsigmoid: return {"kc_hardsigmoid", "return fminf(fmaxf(a + 3.f, 0.f), 6.f) * (1.f / 6.f);", nullptr, {}};
    case OpId::kHardswish: return {"kc_hardswish", "return a * fminf(fmaxf(a + 3.f, 0.f), 6.f) * (1.f / 6.f);", nullptr, {}};
    case OpId::kSoftplus:
      return {"kc_softplus", "return (a * p) > q ? a : log1pf(expf(a * p)) / p;", nullptr, {"beta", "threshold"}};
    case OpId::kMish: return {"kc_mish", "return a * tanhf(log1pf(expf(a)));", nullptr, {}};
    default: return {nullptr, "", nullptr, {}};
  }
}

// The backward ops: a = grad_output, b = the saved tensor.
EwOp ew_backward(const OpCall& c) {
  const std::string approx = c.string_arg("approximate", "none");
  switch (c.op) {
    case OpId::kReluBackward:   // the threshold compares in the tensor's type, as eager does
      return {"kc_threshold_backward", "return b <= ld(st(p)) ? 0.f : a;", "self", {"threshold"}};
    case OpId::kGeluBackward:
      if (approx == "none")
        return {"kc_gelu_backward",
                "const float cdf = 0.5f * (1.f + erff(b * 0.70710678118654752440f));"
                " const float pdf = 0.39894228040143267794f * expf(b * b * -0.5f); return a * (cdf + b * pdf);",
                "self", {}};
      if (approx == "tanh") return {"kc_gelu_tanh_backward", kGeluTanhBackBody, "self", {}};
      return {nullptr, "", nullptr, {}};
    case OpId::kSiluBackward:
      return {"kc_silu_backward", "const float s = 1.f / (1.f + expf(-b)); return a * s * (1.f + b * (1.f - s));",
              "self", {}};
    case OpId::kSigmoidBackward: return {"kc_sigmoid_backward", "return a * (1.f - b) * b;", "output", {}};
    case OpId::kTanhBackward: return {"kc_tanh_backward", "return a * (1.f - b * b);", "output", {}};
    case OpId::kLeakyReluBackward:
      return {"kc_leaky_relu_backward", "return b > 0.f ? a : a * p;", "self", {"negative_slope"}};
    case OpId::kEluBackward:
      if (c.int_arg("is_result", 0))
        return {"kc_elu_backward_result", "return b <= 0.f ? a * r * (b + p * q) : a * q;", "self_or_result",
                {"alpha", "scale", "input_scale"}};
      return {"kc_elu_backward", "return b <= 0.f ? a * r * (p * q) * expf(b * r) : a * q;", "self_or_result",
              {"alpha", "scale", "input_scale"}};
    case OpId::kHardtanhBackward:
      return {"kc_hardtanh_backward", "return (b <= p) || (b >= q) ? 0.f : a;", "self", {"min_val", "max_val"}};
    case OpId::kHardsigmoidBackward:
      return {"kc_hardsigmoid_backward", "return (b > -3.f && b < 3.f) ? a * (1.f / 6.f) : 0.f;", "self", {}};
    case OpId::kHardswishBackward:
      return {"kc_hardswish_backward", "return b < -3.f ? 0.f : (b <= 3.f ? a * ((b / 3.f) + 0.5f) : a);", "self", {}};
    case OpId::kSoftplusBackward:
      return {"kc_softplus_backward", "const float z = expf(b * p); return (b * p) > q ? a : a * z / (z + 1.f);",
              "self", {"beta", "threshold"}};
    case OpId::kMishBackward:
      return {"kc_mish_backward",
              "const float s = 1.f / (1.f + expf(-b)); const float t = tanhf(log1pf(expf(b)));"
              " return a * (t + b * s * (1.f - t * t));",
              "self", {}};
    default: return {nullptr, "", nullptr, {}};
  }
}

// Fast math for 16-bit data (knob `math` = 1): hardware exp2/log2/reciprocal approximations
// (about 2^-22 relative) with a series where they would cancel, so the fp32 result stays within a
// few 1e-6 relative of the exact one before it is rounded to bf16 (2^-9) or fp16 (2^-12). NaN and
// +-inf follow the precise bodies. The intrinsics flush subnormals, so results that go through a
// term below about 1e-38 come out as 0: silu and sigmoid below x = -87 (silu(-88) is -5e-37).
// Offered only for 16-bit data: in fp32 these ops already run at the memory bound, and the static
// check refuses approximate intrinsics on fp32 data.
const char* kFastMath = R"CU(__device__ __forceinline__ float kc_fsigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }
// expm1: the Taylor series to x^6 where exp(x) - 1 would cancel (|x| <= 1/4; error < 1e-7 relative).
__device__ __forceinline__ float kc_fexpm1(float x) {
  const float s = x * (1.f + x * (0.5f + x * (1.f / 6 + x * (1.f / 24 + x * (1.f / 120 + x * (1.f / 720))))));
  return fabsf(x) <= 0.25f ? s : __expf(x) - 1.f;
}
// log1p(t) for 0 <= t <= 1 (or NaN): the series to t^5 below 1/16 (error < 2e-7 relative).
__device__ __forceinline__ float kc_flog1p01(float t) {
  const float s = t * (1.f + t * (-0.5f + t * (1.f / 3 + t * (-0.25f + t * 0.2f))));
  return t <= 0.0625f ? s : __logf(1.f + t);
}
// log(1 + exp(y)) = max(y, 0) + log1p(exp(-|y|)): no overflow, no cancellation.
__device__ __forceinline__ float kc_fsoftplus(float y) { return fmaxf(y, 0.f) + kc_flog1p01(__expf(-fabsf(y))); }
// tanh: the odd series to x^7 below 1/8 (error < 1e-9 relative), else 1 - 2 / (exp(2|x|) + 1).
__device__ __forceinline__ float kc_ftanh(float x) {
  const float ax = fabsf(x), s = x * x;
  const float small = x + x * s * (-1.f / 3 + s * (2.f / 15 + s * (-17.f / 315)));
  return ax < 0.125f ? small : copysignf(1.f - __fdividef(2.f, __expf(2.f * ax) + 1.f), x);
}
// erfc(z) for z >= 0 (or NaN): t exp(-z^2 + P(t)) with t = 1 / (1 + z / 2), a Chebyshev fit with a
// fractional error below 1.2e-7 at every z; erf gelu as 0.5 x erfc(-x / sqrt 2) never cancels.
__device__ __forceinline__ float kc_ferfc(float z) {
  const float t = __fdividef(1.f, 1.f + 0.5f * z);
  const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f +
                  t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  return t * __expf(p - z * z);
}
// tanh(softplus(x)) = w / (w + 2) with w = e^x (e^x + 2); 1 in float from x = 15 on.
__device__ __forceinline__ float kc_ftanh_softplus(float x) {
  const float n = __expf(fminf(x, 15.f)), w = n * (n + 2.f);
  return x > 15.f ? 1.f : __fdividef(w, w + 2.f);
}
)CU";

// The fast-math body of the op of `c` (kFastMath), or "" where the precise one has no
// transcendental worth replacing. Same operands and scalars as ew_forward / ew_backward; the tanh
// gelu's are its precise bodies with kc_ftanh. Not the erf gelu's backward: near its zero
// (x = -0.75) cdf + x pdf cancels, and the approximations' 1e-7 showed as 2-ulp fp16 errors in a
// sweep where erff's did not.
std::string ew_fast(const OpCall& c) {
  const bool tanh_approx = c.string_arg("approximate", "none") == "tanh";
  switch (c.op) {
    case OpId::kGelu:
      return tanh_approx ? replace_all(kGeluTanhBody, "tanhf(", "kc_ftanh(")
                         : "const float c = kc_ferfc(fabsf(a) * 0.70710678118654752440f); return 0.5f * a * (a >= 0.f ? 2.f - c : c);";
    case OpId::kSilu: return "return a * kc_fsigmoid(a);";
    case OpId::kSigmoid: return "return kc_fsigmoid(a);";
    case OpId::kTanh: return "return kc_ftanh(a);";
    case OpId::kElu: return "return a > 0.f ? a * q : kc_fexpm1(a * r) * (p * q);";
    case OpId::kSoftplus: return "const float y = a * p; return y > q ? a : __fdividef(kc_fsoftplus(y), p);";
    case OpId::kMish: return "return a * kc_ftanh_softplus(a);";
    case OpId::kGeluBackward: return tanh_approx ? replace_all(kGeluTanhBackBody, "tanhf(", "kc_ftanh(") : "";
    case OpId::kSiluBackward: return "const float s = kc_fsigmoid(b); return a * s * (1.f + b * (1.f - s));";
    case OpId::kEluBackward:
      return c.int_arg("is_result", 0) ? "" : "return b <= 0.f ? a * r * (p * q) * __expf(b * r) : a * q;";
    case OpId::kSoftplusBackward: return "const float y = b * p; return y > q ? a : a * kc_fsigmoid(y);";
    case OpId::kMishBackward:
      return "const float s = kc_fsigmoid(b), t = kc_ftanh_softplus(b); return a * (t + b * s * (1.f - t * t));";
    default: return "";
  }
}

// The op of `c`, or {nullptr} when it (or its variant) is not handled.
EwOp ew_op(const OpCall& c) { return op_info(c.op).family == OpFamily::kUnary ? ew_forward(c) : ew_backward(c); }

// True when every scalar the op reads is a number that converts to float.
bool params_ok(const OpCall& c, const EwOp& op) {
  for (const char* n : op.params) {
    const ScalarArg* s = c.scalar(n);
    if (!s) return false;
    double v = 0;
    if (auto* d = std::get_if<double>(&s->value)) v = *d;
    else if (auto* i = std::get_if<int64_t>(&s->value)) v = static_cast<double>(*i);
    else return false;
    if (std::isfinite(v) && std::fabs(v) > FLT_MAX) return false;
  }
  return true;
}

const char* kEwBody = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
__device__ __forceinline__ V kc_apply(const V& a, const V& b, float p, float q, float r) {
  V o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_op(ld(a.v[e]), ld(b.v[e]), p, q, r));
  return o;
}
#if KC_BINARY
#define KC_IN1 , const T* __restrict__ in1
#define KC_LOAD(u, i) do { ra[u] = va[i]; rb[u] = vb[i]; } while (0)
#define KC_B1(i) ld(in1[i])
#else
#define KC_IN1
#define KC_LOAD(u, i) do { ra[u] = va[i]; rb[u] = ra[u]; } while (0)
#define KC_B1(i) 0.f
#endif
extern "C" __global__ void __launch_bounds__(BLOCK) KC_ENTRY(T* __restrict__ out, const T* __restrict__ in0 KC_IN1,
                                                             long long n, float p, float q, float r) {
  const long long nv = n / VEC;
  const long long tile = (long long)BLOCK * UNROLL;
  const long long tiles = (nv + tile - 1) / tile;
  const V* va = reinterpret_cast<const V*>(in0);
#if KC_BINARY
  const V* vb = reinterpret_cast<const V*>(in1);
#endif
  V* vo = reinterpret_cast<V*>(out);
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long base = t * tile + threadIdx.x;
    V ra[UNROLL], rb[UNROLL];
    if ((t + 1) * tile <= nv) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) KC_LOAD(u, base + u * BLOCK);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) vo[base + u * BLOCK] = kc_apply(ra[u], rb[u], p, q, r);
    } else {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (base + u * BLOCK < nv) KC_LOAD(u, base + u * BLOCK);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (base + u * BLOCK < nv) vo[base + u * BLOCK] = kc_apply(ra[u], rb[u], p, q, r);
    }
  }
  if (blockIdx.x == 0)
    for (long long i = nv * VEC + threadIdx.x; i < n; i += BLOCK) out[i] = st(kc_op(ld(in0[i]), KC_B1(i), p, q, r));
}
)CU";

class ElementwiseTemplate : public Template {
 public:
  explicit ElementwiseTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cuda.unary_backward" : "cuda.unary"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    const OpFamily fam = op_info(c.op).family;
    if (c.backend != BackendKind::kCuda || fam != (backward_ ? OpFamily::kUnaryBackward : OpFamily::kUnary)) return {};
    EwOp op = ew_op(c);
    if (!op.entry || c.outputs.size() != 1 || !c.dense()) return {};
    const TensorMeta* a = c.input(backward_ ? "grad_output" : "self");
    if (!a || !a->defined || !elem_dtype(a->dtype) || a->numel() == 0) return {};
    if (op.second) {
      const TensorMeta* b = c.input(op.second);
      if (!tensor_ok(b, a->dtype) || b->sizes != a->sizes) return {};
    }
    const TensorMeta& o = c.outputs[0];
    if (!o.defined || o.dtype != a->dtype || o.sizes != a->sizes) return {};
    if (!params_ok(c, op)) return {};
    const int64_t wide = a->dtype == DType::kF32 ? 4 : 8;
    std::vector<int64_t> vecs = a->dtype == DType::kF32 ? std::vector<int64_t>{1, 2, 4} : std::vector<int64_t>{1, 2, 4, 8};
    std::vector<KnobDim> dims = {{"block", {256, 128, 512, 1024}},
                                 {"vec", with_default(vecs, wide)},
                                 {"unroll", with_default({1, 2, 4, 8}, 4)},
                                 {"grid_stride", {0, 1, 2, 4, 8}}};
    // 16-bit data moves half the bytes per element, so transcendental-heavy ops become bound by
    // the math; fast math (kFastMath) first there.
    if (a->dtype != DType::kF32 && !ew_fast(c).empty()) dims.push_back({"math", {1, 0}});
    return dims;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported(std::string(name()) + " does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const int64_t block = k["block"], vec = k["vec"], unroll = k["unroll"], gs = k["grid_stride"];
    EwOp op = ew_op(c);
    const int nin = op.second ? 2 : 1;
    if (unroll * vec * nin > std::min<int64_t>(64, 16384 / block))
      return unsupported("block " + S(block) + " x unroll " + S(unroll) + " x vec " + S(vec) + " is over the register budget");
    const std::string a = backward_ ? "grad_output" : "self";
    const bool fast = k.count("math") && k["math"] == 1;
    std::string src = "// kernelcraft " + std::string(name()) + " " + op.entry + " " + dtype_name(c.outputs[0].dtype) +
                      (fast ? " fast math" : "") + "\n" + dtype_prelude(c.outputs[0].dtype) + (fast ? kFastMath : "") +
                      "constexpr int BLOCK = " + S(block) + ", VEC = " + S(vec) + ", UNROLL = " + S(unroll) +
                      ";\n#define KC_BINARY " + S(nin == 2) +
                      "\n__device__ __forceinline__ float kc_op(float a, float b, float p, float q, float r) { " +
                      (fast ? ew_fast(c) : op.body) + " }\n" + with_entry(kEwBody, op.entry);
    std::string tiles = "ceil_div(numel(" + a + "), " + S(block * unroll * vec) + ")";
    std::string grid = gs == 0 ? tiles : "min(" + tiles + ", " + S(kSms * gs) + ")";
    std::vector<std::string> args = {"ptr:out0", "ptr:" + a};
    if (op.second) args.push_back(std::string("ptr:") + op.second);
    args.push_back("i64:numel(" + a + ")");
    for (size_t i = 0; i < 3; ++i) args.push_back(i < op.params.size() ? std::string("f32:") + op.params[i] : "f32:0");
    return make_candidate(name(), std::move(k), std::move(src), json::array({launch(op.entry, {grid}, {block}, args)}));
  }

 private:
  bool backward_;
};


}  // namespace

const Template* cuda_elementwise_template(bool backward) {
  static const ElementwiseTemplate fwd(false), bwd(true);
  return backward ? &bwd : &fwd;
}

}  // namespace kc::evolve
