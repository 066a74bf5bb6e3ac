// CUDA op-family templates: elementwise (unary and unary backward), softmax / log_softmax and
// their backward, layer norm and its backward. A template renders NVRTC source plus a launch spec
// for one call and one knob setting. Sources depend on the op, dtype and knobs only (sizes are
// kernel arguments, register-cached row lengths are rounded to powers of two), so one compiled
// source serves many shapes. Everything is for contiguous, 16-byte aligned tensors
// (OpCall::dense()); math is fp32 with accurate expf/logf/erff/tanhf (no fast math).
//
// Knobs a render does not use for a setting (e.g. "rows" when a block owns a row) are set to
// their canonical value in Candidate::knobs, so two settings that render the same code share an
// id. Knob values outside space() and combinations over the register budget are kUnsupported.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "evolve/proposer.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

// H100 / H200 SXM. Grid-stride launches size their grid as a multiple of it; elsewhere it only
// shapes defaults, never correctness.
constexpr int64_t kSms = 132;

Status unsupported(const std::string& m) { return Status::error(Code::kUnsupported, m); }
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
std::string S(int64_t v) { return std::to_string(v); }

// `body` with its entry placeholder KC_ENTRY replaced by the entry's name, so the rendered source
// names its entry literally.
std::string with_entry(const char* body, const std::string& entry) {
  std::string s = body;
  for (size_t p; (p = s.find("KC_ENTRY")) != std::string::npos;) s.replace(p, 8, entry);
  return s;
}

bool elem_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// The element type T with float conversions ld/st. Halves are raw 16-bit words converted with PTX
// (f16) or bit operations (bf16, round to nearest even, NaN kept quiet), so no CUDA header is
// needed (NVRTC may have no include directory).
std::string dtype_prelude(DType d) {
  std::string s = "#define KC_INF __int_as_float(0x7f800000)\n#define KC_NAN __int_as_float(0x7fffffff)\n";
  if (d == DType::kF32)
    return s + R"CU(typedef float T;
__device__ __forceinline__ float ld(T v) { return v; }
__device__ __forceinline__ T st(float v) { return v; }
)CU";
  if (d == DType::kF16)
    return s + R"CU(typedef unsigned short T;
__device__ __forceinline__ float ld(T v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
__device__ __forceinline__ T st(float f) { T h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
)CU";
  return s + R"CU(typedef unsigned short T;
__device__ __forceinline__ float ld(T v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ T st(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (T)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (T)(u >> 16);
}
)CU";
}

// Reductions over a group of G threads owning one row: G == 32 is one warp (xor shuffles leave
// the identical result in every lane), G > 32 is the whole block (warp shuffles, then every
// thread folds the per-warp values from shared memory in the same order). The trailing barrier
// lets the next reduction reuse the shared array. Welford merges are not symmetric, so they reduce
// down to lane 0 and broadcast.
const char* kGroupHelpers = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
__device__ __forceinline__ float kc_gsum(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) v += sh[w];
    __syncthreads();
  }
  return v;
}
__device__ __forceinline__ void kc_gsum2(float& a, float& b, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) { sh[threadIdx.x >> 5] = a; sh[32 + (threadIdx.x >> 5)] = b; }
    __syncthreads();
    a = sh[0];
    b = sh[32];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) { a += sh[w]; b += sh[32 + w]; }
    __syncthreads();
  }
}
__device__ __forceinline__ float kc_gmax(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh[0];
#pragma unroll
    for (int w = 1; w < G / 32; ++w) v = fmaxf(v, sh[w]);
    __syncthreads();
  }
  return v;
}
// Welford / Chan: count n, mean m, sum of squared deviations q.
struct KcW { float n, m, q; };
__device__ __forceinline__ void kc_wadd(KcW& a, float nb, float mb, float qb) {
  if (nb == 0.f) return;
  if (a.n == 0.f) { a.n = nb; a.m = mb; a.q = qb; return; }
  const float nn = a.n + nb;
  const float d = mb - a.m;
  const float f = nb / nn;
  a.m = a.m + d * f;
  a.q = a.q + qb + d * d * a.n * f;
  a.n = nn;
}
__device__ __forceinline__ void kc_gwelford(KcW& a, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float n = __shfl_down_sync(0xffffffffu, a.n, o);
    const float m = __shfl_down_sync(0xffffffffu, a.m, o);
    const float q = __shfl_down_sync(0xffffffffu, a.q, o);
    kc_wadd(a, n, m, q);
  }
  if constexpr (G == 32) {
    a.n = __shfl_sync(0xffffffffu, a.n, 0);
    a.m = __shfl_sync(0xffffffffu, a.m, 0);
    a.q = __shfl_sync(0xffffffffu, a.q, 0);
  } else {
    if ((threadIdx.x & 31) == 0) {
      sh[threadIdx.x >> 5] = a.n; sh[32 + (threadIdx.x >> 5)] = a.m; sh[64 + (threadIdx.x >> 5)] = a.q;
    }
    __syncthreads();
    a.n = sh[0]; a.m = sh[32]; a.q = sh[64];
    for (int w = 1; w < G / 32; ++w) kc_wadd(a, sh[w], sh[32 + w], sh[64 + w]);
    __syncthreads();
  }
}
)CU";

// ---------------------------------------------------------------------------------------------
// Knob plumbing.

// `values` with `first` moved to the front (the default), the rest in their order.
std::vector<int64_t> with_default(std::vector<int64_t> values, int64_t first) {
  auto it = std::find(values.begin(), values.end(), first);
  if (it != values.end()) values.erase(it);
  values.insert(values.begin(), first);
  return values;
}

// Every dimension's value from `k` (its default when absent); values outside a dimension are
// kUnsupported. Names `k` has and the space lacks are ignored.
Result<Knobs> pick(const std::vector<KnobDim>& space, const Knobs& k) {
  Knobs out;
  for (const auto& d : space) {
    auto it = k.find(d.name);
    int64_t v = it == k.end() ? d.values.front() : it->second;
    if (std::find(d.values.begin(), d.values.end(), v) == d.values.end())
      return unsupported("knob " + d.name + "=" + S(v) + " is not in this call's space");
    out[d.name] = v;
  }
  return out;
}

// Floats a thread may cache in registers per array: above 512 threads __launch_bounds__ leaves
// 64 registers a thread.
int64_t reg_budget(int64_t threads) { return threads >= 1024 ? 16 : 32; }

std::vector<int64_t> vec_values(DType d, int64_t row) {
  std::vector<int64_t> v;
  for (int64_t x : {1, 2, 4, 8})
    if ((x <= 4 || d != DType::kF32) && row % x == 0) v.push_back(x);
  return v;
}

// Row templates (softmax, layer norm): a group of `threads` threads owns a row; 32 means one warp
// per row and `rows` warps a block, more means one block per row.
struct RowGeom {
  int64_t g = 32, rpb = 1, vec = 1, items = 0;   // items: vectors a thread caches (0: none)
};

// Default geometry for rows of L elements: the widest vector dividing the row, about 8 vectors
// per thread, 4 rows a block for warp rows; registers when the row fits.
void row_space(std::vector<KnobDim>& sp, DType d, int64_t L, bool with_regs) {
  auto vecs = vec_values(d, L);
  int64_t vec = vecs.back();
  int64_t g = std::clamp<int64_t>(pow2_ceil(cdiv(L / vec, 8)), 32, 1024);
  sp.push_back({"threads", with_default({32, 64, 128, 256, 512, 1024}, g)});
  sp.push_back({"rows", with_default({1, 2, 4, 8}, g == 32 ? 4 : 1)});
  sp.push_back({"vec", with_default(vecs, vec)});
  if (with_regs) {
    const int64_t nt = g == 32 ? 128 : g;
    bool fits = pow2_ceil(cdiv(L / vec, g)) * vec <= reg_budget(nt);
    sp.push_back({"regs", fits ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1}});
  }
}

Result<RowGeom> row_geom(Knobs& k, int64_t L) {
  RowGeom r;
  r.g = k.at("threads");
  if (r.g > 32) k["rows"] = 1;
  r.rpb = k.at("rows");
  r.vec = k.at("vec");
  if (L % r.vec != 0) return unsupported("vec " + S(r.vec) + " does not divide the row (" + S(L) + ")");
  if (k.count("regs") && k.at("regs")) {
    r.items = pow2_ceil(cdiv(L / r.vec, r.g));
    if (r.items * r.vec > reg_budget(r.g * r.rpb))
      return unsupported("a row of " + S(L) + " does not fit " + S(r.g) + " threads' registers");
  }
  return r;
}

std::string row_consts(const RowGeom& r) {
  return "constexpr int G = " + S(r.g) + ", RPB = " + S(r.rpb) + ", NT = G * RPB, VEC = " + S(r.vec) +
         ", ITEMS = " + S(r.items) + ";\n";
}

std::string row_grid(const RowGeom& r, const std::string& rows) {
  return r.g == 32 ? "ceil_div(" + rows + ", " + S(r.rpb) + ")" : rows;
}

json launch(const std::string& entry, const std::vector<json>& grid, const std::vector<json>& block,
            const std::vector<std::string>& args) {
  json l = json::object();
  l["entry"] = entry;
  l["grid"] = json(grid);
  l["block"] = json(block);
  l["smem"] = 0;
  l["args"] = args;
  return l;
}

Candidate make_candidate(const char* family, Knobs k, std::string src, json launches, json scratch = nullptr) {
  Candidate c;
  c.family = family;
  c.knobs = std::move(k);
  c.source = std::move(src);
  c.launch = {{"version", 1}, {"launches", std::move(launches)}};
  if (!scratch.is_null()) c.launch["scratch"] = std::move(scratch);
  return c;
}

bool tensor_ok(const TensorMeta* t, DType d) { return t && t->defined && t->dtype == d; }

// ---------------------------------------------------------------------------------------------
// Elementwise: out = f(a) or f(grad, b). Each thread handles `unroll` vectors of `vec` elements a
// tile (coalesced: vector u of thread t is t + u * block), full tiles without bounds checks, the
// elements after the last whole vector by block 0.

struct EwOp {
  const char* entry;
  std::string body;        // float kc_op(float a, float b, float p): a = self / grad, b = the 2nd input
  const char* second;      // name of the second input (nullptr for unary ops)
  const char* param;       // "f32:threshold" or "f32:0"
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

// The op of `c`, or nullopt-like {nullptr} when its scalars are not handled.
EwOp ew_op(const OpCall& c) {
  const std::string approx = c.string_arg("approximate", "none");
  switch (c.op) {
    case OpId::kRelu: return {"kc_relu", "return (a > 0.f || a != a) ? a : 0.f;", nullptr, "f32:0"};
    case OpId::kGelu:
      if (approx == "none")
        return {"kc_gelu", "return a * 0.5f * (1.f + erff(a * 0.70710678118654752440f));", nullptr, "f32:0"};
      if (approx == "tanh") return {"kc_gelu_tanh", kGeluTanhBody, nullptr, "f32:0"};
      return {nullptr, "", nullptr, ""};
    case OpId::kSilu: return {"kc_silu", "return a / (1.f + expf(-a));", nullptr, "f32:0"};
    case OpId::kSigmoid: return {"kc_sigmoid", "return 1.f / (1.f + expf(-a));", nullptr, "f32:0"};
    case OpId::kTanh: return {"kc_tanh", "return tanhf(a);", nullptr, "f32:0"};
    case OpId::kReluBackward:
      return {"kc_threshold_backward", "return b <= p ? 0.f : a;", "self", "f32:threshold"};
    case OpId::kGeluBackward:
      if (approx == "none")
        return {"kc_gelu_backward",
                "const float cdf = 0.5f * (1.f + erff(b * 0.70710678118654752440f));"
                " const float pdf = 0.39894228040143267794f * expf(b * b * -0.5f); return a * (cdf + b * pdf);",
                "self", "f32:0"};
      if (approx == "tanh") return {"kc_gelu_tanh_backward", kGeluTanhBackBody, "self", "f32:0"};
      return {nullptr, "", nullptr, ""};
    case OpId::kSiluBackward:
      return {"kc_silu_backward",
              "const float s = 1.f / (1.f + expf(-b)); return a * s * (1.f + b * (1.f - s));", "self", "f32:0"};
    case OpId::kSigmoidBackward:
      return {"kc_sigmoid_backward", "return a * (1.f - b) * b;", "output", "f32:0"};
    case OpId::kTanhBackward: return {"kc_tanh_backward", "return a * (1.f - b * b);", "output", "f32:0"};
    default: return {nullptr, "", nullptr, ""};
  }
}

const char* kEwBody = R"CU(
struct alignas(sizeof(T) * VEC) V { T v[VEC]; };
__device__ __forceinline__ V kc_apply(const V& a, const V& b, float p) {
  V r;
#pragma unroll
  for (int e = 0; e < VEC; ++e) r.v[e] = st(kc_op(ld(a.v[e]), ld(b.v[e]), p));
  return r;
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
                                                             long long n, float p) {
  p = ld(st(p));   // a threshold compares in the tensor's type, as eager does
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
      for (int u = 0; u < UNROLL; ++u) vo[base + u * BLOCK] = kc_apply(ra[u], rb[u], p);
    } else {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (base + u * BLOCK < nv) KC_LOAD(u, base + u * BLOCK);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
        if (base + u * BLOCK < nv) vo[base + u * BLOCK] = kc_apply(ra[u], rb[u], p);
    }
  }
  if (blockIdx.x == 0)
    for (long long i = nv * VEC + threadIdx.x; i < n; i += BLOCK) out[i] = st(kc_op(ld(in0[i]), KC_B1(i), p));
}
)CU";

class ElementwiseTemplate : public Template {
 public:
  explicit ElementwiseTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cuda.unary_backward" : "cuda.unary"; }
  const char* backend() const override { return "cuda"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    const OpFamily fam = op_info(c.op).family;
    if (c.backend != "cuda" || fam != (backward_ ? OpFamily::kUnaryBackward : OpFamily::kUnary)) return {};
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
    if (c.op == OpId::kReluBackward) {
      const ScalarArg* th = c.scalar("threshold");
      if (!th) return {};
      double v = 0;
      if (auto* d = std::get_if<double>(&th->value)) v = *d;
      else if (auto* i = std::get_if<int64_t>(&th->value)) v = static_cast<double>(*i);
      else return {};
      if (std::isfinite(v) && std::fabs(v) > FLT_MAX) return {};
    }
    const int64_t wide = a->dtype == DType::kF32 ? 4 : 8;
    std::vector<int64_t> vecs = a->dtype == DType::kF32 ? std::vector<int64_t>{1, 2, 4} : std::vector<int64_t>{1, 2, 4, 8};
    return {{"block", {256, 128, 512, 1024}},
            {"vec", with_default(vecs, wide)},
            {"unroll", with_default({1, 2, 4, 8}, 4)},
            {"grid_stride", {0, 1, 2, 4, 8}}};
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
    std::string src = "// kernelcraft " + std::string(name()) + " " + op.entry + " " + dtype_name(c.outputs[0].dtype) + "\n" +
                      dtype_prelude(c.outputs[0].dtype) + "constexpr int BLOCK = " + S(block) + ", VEC = " + S(vec) +
                      ", UNROLL = " + S(unroll) + ";\n#define KC_BINARY " + S(nin == 2) +
                      "\n__device__ __forceinline__ float kc_op(float a, float b, float p) { " + op.body +
                      " }\n" + with_entry(kEwBody, op.entry);
    std::string tiles = "ceil_div(numel(" + a + "), " + S(block * unroll * vec) + ")";
    std::string grid = gs == 0 ? tiles : "min(" + tiles + ", " + S(kSms * gs) + ")";
    std::vector<std::string> args = {"ptr:out0", "ptr:" + a};
    if (op.second) args.push_back(std::string("ptr:") + op.second);
    args.push_back("i64:numel(" + a + ")");
    args.push_back(op.param);
    return make_candidate(name(), std::move(k), std::move(src), json::array({launch(op.entry, {grid}, {block}, args)}));
  }

 private:
  bool backward_;
};

// ---------------------------------------------------------------------------------------------
// Softmax / log_softmax over the last dimension, and their backward.

const char* kSoftmaxBody = R"CU(
// Online (max, sum) state: s is the sum of exp(x - m). An +inf or NaN input poisons s as eager's
// exp(inf - inf) / exp(NaN) would; -inf inputs add nothing.
__device__ __forceinline__ void kc_upd(float& m, float& s, float x) {
  if (x > m) { s = __fmul_rn(s, expf(m - x)) + (x == KC_INF ? KC_NAN : 1.f); m = x; }
  else if (x != -KC_INF) s += expf(x - m);
}
__device__ __forceinline__ void kc_merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  const float a = m == -KC_INF ? 0.f : __fmul_rn(s, expf(m - mm));
  const float b = m2 == -KC_INF ? 0.f : __fmul_rn(s2, expf(m2 - mm));
  m = mm;
  s = a + b;
}
__device__ __forceinline__ void kc_gmerge(float& m, float& s, float* shm, float* shs) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) kc_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if constexpr (G > 32) {
    if ((threadIdx.x & 31) == 0) { shm[threadIdx.x >> 5] = m; shs[threadIdx.x >> 5] = s; }
    __syncthreads();
    m = shm[0];
    s = shs[0];
    for (int w = 1; w < G / 32; ++w) kc_merge(m, s, shm[w], shs[w]);
    __syncthreads();
  }
}
__device__ __forceinline__ float kc_out(float x, float m, float s, float ls) {
  if constexpr (LOG) return (x - m) - ls;
  else return expf(x - m) / s;
}
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ out, const T* __restrict__ x, long long rows, int L) {
  __shared__ float sh_m[32], sh_s[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  const V* xv = reinterpret_cast<const V*>(x + row * L);
  V* ov = reinterpret_cast<V*>(out + row * L);
  const int nv = L / VEC;
  float m = -KC_INF, s = 0.f;
  float r[ITEMS > 0 ? ITEMS : 1][VEC];
  if constexpr (ITEMS > 0) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        const V v = xv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[k][e] = ld(v.v[e]);
      }
    }
    if constexpr (ONLINE) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (k * G + t < nv)
#pragma unroll
          for (int e = 0; e < VEC; ++e) kc_upd(m, s, r[k][e]);
      kc_gmerge(m, s, sh_m, sh_s);
    } else {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (k * G + t < nv)
#pragma unroll
          for (int e = 0; e < VEC; ++e) m = fmaxf(m, r[k][e]);
      m = kc_gmax(m, sh_m);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
        if (k * G + t < nv)
#pragma unroll
          for (int e = 0; e < VEC; ++e) s += expf(r[k][e] - m);
      s = kc_gsum(s, sh_s);
    }
  } else if constexpr (ONLINE) {
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) kc_upd(m, s, ld(v.v[e]));
    }
    kc_gmerge(m, s, sh_m, sh_s);
  } else {
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = fmaxf(m, ld(v.v[e]));
    }
    m = kc_gmax(m, sh_m);
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += expf(ld(v.v[e]) - m);
    }
    s = kc_gsum(s, sh_s);
  }
  const float ls = LOG ? logf(s) : 0.f;
  if constexpr (ITEMS > 0) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_out(r[k][e], m, s, ls));
        ov[i] = o;
      }
    }
  } else {
    for (int i = t; i < nv; i += G) {
      const V v = xv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_out(ld(v.v[e]), m, s, ls));
      ov[i] = o;
    }
  }
}
)CU";

// softmax: gi = y * (g - sum(g * y)); log_softmax: gi = g - exp(y) * sum(g).
const char* kSoftmaxBackBody = R"CU(
__device__ __forceinline__ float kc_dot(float g, float y) { if constexpr (LOG) return g; else return g * y; }
__device__ __forceinline__ float kc_gi(float g, float y, float d) {
  if constexpr (LOG) return g - expf(y) * d;
  else return y * (g - d);
}
extern "C" __global__ void __launch_bounds__(NT) KC_ENTRY(T* __restrict__ gi, const T* __restrict__ g, const T* __restrict__ y,
                                                          long long rows, int L) {
  __shared__ float sh[32];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= rows) return;   // whole warps only (G == 32); a block row always exists
  const V* gv = reinterpret_cast<const V*>(g + row * L);
  const V* yv = reinterpret_cast<const V*>(y + row * L);
  V* ov = reinterpret_cast<V*>(gi + row * L);
  const int nv = L / VEC;
  float d = 0.f;
  if constexpr (ITEMS > 0) {
    V rg[ITEMS > 0 ? ITEMS : 1], ry[ITEMS > 0 ? ITEMS : 1];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        rg[k] = gv[i];
        ry[k] = yv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += kc_dot(ld(rg[k].v[e]), ld(ry[k].v[e]));
      }
    }
    d = kc_gsum(d, sh);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        V o;
#pragma unroll
        for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_gi(ld(rg[k].v[e]), ld(ry[k].v[e]), d));
        ov[i] = o;
      }
    }
  } else {
    for (int i = t; i < nv; i += G) {
      const V a = gv[i];
      if constexpr (LOG) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += ld(a.v[e]);
      } else {
        const V b = yv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += ld(a.v[e]) * ld(b.v[e]);
      }
    }
    d = kc_gsum(d, sh);
    for (int i = t; i < nv; i += G) {
      const V a = gv[i], b = yv[i];
      V o;
#pragma unroll
      for (int e = 0; e < VEC; ++e) o.v[e] = st(kc_gi(ld(a.v[e]), ld(b.v[e]), d));
      ov[i] = o;
    }
  }
}
)CU";

class SoftmaxTemplate : public Template {
 public:
  explicit SoftmaxTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cuda.softmax_backward" : "cuda.softmax"; }
  const char* backend() const override { return "cuda"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    const TensorMeta* x = rowed(c);
    if (!x) return {};
    std::vector<KnobDim> sp;
    row_space(sp, x->dtype, x->sizes.back(), true);
    if (!backward_) sp.push_back({"online", {0, 1}});
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported(std::string(name()) + " does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const TensorMeta* x = rowed(c);
    auto gr = row_geom(k, x->sizes.back());
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    const bool log = c.op == OpId::kLogSoftmax || c.op == OpId::kLogSoftmaxBackward;
    const std::string entry = std::string(log ? "kc_log_softmax" : "kc_softmax") + (backward_ ? "_backward" : "");
    std::string src = "// kernelcraft " + std::string(name()) + " " + entry + " " + dtype_name(x->dtype) + "\n" +
                      dtype_prelude(x->dtype) + row_consts(r) + "constexpr bool LOG = " + (log ? "true" : "false") +
                      ", ONLINE = " + (!backward_ && k["online"] ? "true" : "false") + ";\n" + kGroupHelpers +
                      with_entry(backward_ ? kSoftmaxBackBody : kSoftmaxBody, entry);
    const std::string xn = backward_ ? "grad_output" : "self";
    const std::string rows = "numel(" + xn + ") / size(" + xn + ", -1)";
    std::vector<std::string> args = {"ptr:out0"};
    if (backward_) {
      args.push_back("ptr:grad_output");
      args.push_back("ptr:output");
    } else {
      args.push_back("ptr:self");
    }
    args.push_back("i64:" + rows);
    args.push_back("i32:size(" + xn + ", -1)");
    return make_candidate(name(), std::move(k), std::move(src),
                          json::array({launch(entry, {row_grid(r, rows)}, {r.g * r.rpb}, args)}));
  }

 private:
  // The input whose last dimension is reduced, when the call is one this template handles.
  const TensorMeta* rowed(const OpCall& c) const {
    if (c.backend != "cuda") return nullptr;
    const OpFamily fam = op_info(c.op).family;
    if (fam != (backward_ ? OpFamily::kSoftmaxBackward : OpFamily::kSoftmax)) return nullptr;
    if (!c.dense() || c.outputs.size() != 1) return nullptr;
    const TensorMeta* x = c.input(backward_ ? "grad_output" : "self");
    if (!x || !x->defined || !elem_dtype(x->dtype) || x->sizes.empty() || x->numel() == 0) return nullptr;
    const int64_t nd = static_cast<int64_t>(x->sizes.size());
    int64_t dim = c.int_arg("dim", -1);
    if (dim < 0) dim += nd;
    if (dim != nd - 1) return nullptr;
    const int64_t L = x->sizes.back();
    if (L > INT_MAX / 2 || x->numel() / L > INT_MAX) return nullptr;
    if (backward_) {
      const TensorMeta* y = c.input("output");
      if (!tensor_ok(y, x->dtype) || y->sizes != x->sizes) return nullptr;
      if (c.string_arg("input_dtype", dtype_name(x->dtype)) != dtype_name(x->dtype)) return nullptr;
    } else {
      const ScalarArg* h = c.scalar("half_to_float");
      if (h) {
        const bool* b = std::get_if<bool>(&h->value);
        const int64_t* i = std::get_if<int64_t>(&h->value);
        if ((b && *b) || (i && *i)) return nullptr;
      }
    }
    const TensorMeta& o = c.outputs[0];
    if (!o.defined || o.dtype != x->dtype || o.sizes != x->sizes) return nullptr;
    return x;
  }

  bool backward_;
};

// ---------------------------------------------------------------------------------------------
// Layer norm. Rows of N = prod(normalized_shape) elements, M rows. Strategy "split" = 0: a group
// (warp or block) per row; split = S > 0: every row is cut into S chunks, launch 1 writes each
// chunk's (mean, M2) into scratch, launch 2 has every block combine its row's partials (Chan,
// fixed order, so all blocks of a row agree bit for bit), normalise its chunk, and the chunk-0
// block writes mean and rstd.

const std::vector<int64_t> kSplits = {33, 66, 132, 264, 528, 1056};

// Number of rows M and row length N of a layer norm call (forward: input + normalized_shape).
bool ln_geometry(const OpCall& c, int64_t& M, int64_t& N) {
  const TensorMeta* x = c.input("input");
  if (!tensor_ok(x, DType::kF32)) return false;
  auto ns = c.list_arg("normalized_shape");
  const int64_t nd = static_cast<int64_t>(x->sizes.size());
  if (ns.empty() || static_cast<int64_t>(ns.size()) > nd) return false;
  N = 1;
  for (size_t i = 0; i < ns.size(); ++i) {
    if (x->sizes[nd - ns.size() + i] != ns[i]) return false;
    N *= ns[i];
  }
  if (N <= 0 || x->numel() == 0) return false;
  M = x->numel() / N;
  return N <= INT_MAX / 2 && M <= INT_MAX;
}

bool ln_param_ok(const TensorMeta* t, int64_t N) {
  return !t || !t->defined || (t->dtype == DType::kF32 && t->numel() == N);
}

// Split knob values worth trying: chunks of at least 1024 elements, at most 2^31 blocks.
std::vector<int64_t> split_values(int64_t M, int64_t N) {
  std::vector<int64_t> v = {0};
  for (int64_t s : kSplits)
    if (N / s >= 1024 && M * s <= INT_MAX) v.push_back(s);
  // Default: split when rows are too few to fill the GPU, aiming at ~4 blocks per SM.
  int64_t def = 0;
  if (M < 2 * kSms)
    for (int64_t s : v)
      if (s > 0 && (def == 0 || M * def < 4 * kSms)) def = s;
  return with_default(v, def);
}

const char* kLnBody = R"CU(
__device__ __forceinline__ void kc_vstats(const V& v, float& vm, float& vq) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) s += v.v[e];
  vm = s * (1.f / VEC);
  vq = 0.f;
#pragma unroll
  for (int e = 0; e < VEC; ++e) { const float d = v.v[e] - vm; vq += d * d; }
}
__device__ __forceinline__ V kc_norm(const V& v, int i, float mu, float rs, const float* w, const float* b) {
  V wv{}, bv{}, o;
  if constexpr (HAS_W) wv = reinterpret_cast<const V*>(w)[i];
  if constexpr (HAS_B) bv = reinterpret_cast<const V*>(b)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float r = (v.v[e] - mu) * rs;
    if constexpr (HAS_W) r = r * wv.v[e];
    if constexpr (HAS_B) r = r + bv.v[e];
    o.v[e] = r;
  }
  return o;
}
__device__ __forceinline__ int kc_chunk(int N, int S) { return ((N + S - 1) / S + VEC - 1) / VEC * VEC; }

extern "C" __global__ void __launch_bounds__(NT) kc_layer_norm(float* __restrict__ y, float* __restrict__ mean,
    float* __restrict__ rstd, const float* __restrict__ x KC_WB_PARAMS, long long M, int N, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const V* xv = reinterpret_cast<const V*>(x + row * N);
  V* yv = reinterpret_cast<V*>(y + row * N);
  const int nv = N / VEC;
  const float fN = (float)N;
  float mu, rs;
  if constexpr (ITEMS > 0) {
    // Corrected two-pass from registers: mean, then the deviations' sum (fixes the mean's rounding)
    // and squares.
    V r[ITEMS > 0 ? ITEMS : 1];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) {
        r[k] = xv[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += r[k].v[e];
      }
    }
    s = kc_gsum(s, sh);
    mu = s / fN;
    float sd = 0.f, q = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k)
      if (k * G + t < nv)
#pragma unroll
        for (int e = 0; e < VEC; ++e) { const float d = r[k].v[e] - mu; sd += d; q += d * d; }
    kc_gsum2(sd, q, sh);
    const float dm = sd / fN;
    mu += dm;
    rs = 1.f / sqrtf(fmaxf(q / fN - dm * dm, 0.f) + eps);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) yv[i] = kc_norm(r[k], i, mu, rs, w, b);
    }
  } else {
    KcW a{0.f, 0.f, 0.f};
    for (int i = t; i < nv; i += G) {
      float vm, vq;
      kc_vstats(xv[i], vm, vq);
      kc_wadd(a, (float)VEC, vm, vq);
    }
    kc_gwelford(a, sh);
    mu = a.m;
    rs = 1.f / sqrtf(fmaxf(a.q / fN, 0.f) + eps);
    for (int i = t; i < nv; i += G) yv[i] = kc_norm(xv[i], i, mu, rs, w, b);
  }
  if (t == 0) { mean[row] = mu; rstd[row] = rs; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_layer_norm_part(float* __restrict__ part, const float* __restrict__ x,
                                                                    long long M, int N, int S) {
  __shared__ float sh[96];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const V* xv = reinterpret_cast<const V*>(x + row * N);
  KcW a{0.f, 0.f, 0.f};
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) {
    float vm, vq;
    kc_vstats(xv[i], vm, vq);
    kc_wadd(a, (float)VEC, vm, vq);
  }
  kc_gwelford(a, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = a.m; part[2 * (long long)blockIdx.x + 1] = a.q; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_layer_norm_apply(float* __restrict__ y, float* __restrict__ mean,
    float* __restrict__ rstd, const float* __restrict__ x KC_WB_PARAMS, const float* __restrict__ part, long long M,
    int N, int S, float eps) {
  KC_WB_LOCALS
  __shared__ float sh[96];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const float* pr = part + 2 * row * S;
  KcW a{0.f, 0.f, 0.f};
  for (int p = threadIdx.x; p < S; p += NT) {
    const long long n = min(C, max(0LL, (long long)N - p * C));
    kc_wadd(a, (float)n, pr[2 * p], pr[2 * p + 1]);
  }
  kc_gwelford(a, sh);
  const float mu = a.m, rs = 1.f / sqrtf(fmaxf(a.q / (float)N, 0.f) + eps);
  if (c == 0 && threadIdx.x == 0) { mean[row] = mu; rstd[row] = rs; }
  const V* xv = reinterpret_cast<const V*>(x + row * N);
  V* yv = reinterpret_cast<V*>(y + row * N);
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) yv[i] = kc_norm(xv[i], (int)i, mu, rs, w, b);
}
)CU";

// Parameter lists for optional tensors: the launch spec may only name defined ones.
std::string opt_params(const std::vector<std::pair<std::string, bool>>& ps, const char* macro, const char* locals) {
  std::string params = "#define " + std::string(macro), loc = "#define " + std::string(locals);
  for (const auto& [n, on] : ps) {
    if (on) params += " , const float* __restrict__ " + n;
    else loc += " const float* " + n + " = nullptr; (void)" + n + ";";
  }
  return params + "\n" + loc + "\n";
}

class LayerNormTemplate : public Template {
 public:
  const char* name() const override { return "cuda.layer_norm"; }
  const char* backend() const override { return "cuda"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    int64_t M, N;
    if (!handles(c, M, N)) return {};
    std::vector<KnobDim> sp;
    row_space(sp, DType::kF32, N, true);
    auto splits = split_values(M, N);
    if (splits.front() != 0) sp[0].values = with_default(sp[0].values, 256);   // block of the split kernels
    sp.push_back({"split", splits});
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.layer_norm does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    int64_t M = 0, N = 0;
    handles(c, M, N);
    const int64_t split = k["split"];
    if (split > 0) {   // the split kernels stream their chunk twice, one block a chunk
      k["regs"] = 0;
      k["rows"] = 1;
    }
    auto gr = row_geom(k, N);
    if (!gr.is_ok()) return gr.status();
    RowGeom r = gr.value();
    const bool hw = defined(c.input("weight")), hb = defined(c.input("bias"));
    std::string src = "// kernelcraft cuda.layer_norm f32\n" + dtype_prelude(DType::kF32) + row_consts(r) +
                      "constexpr bool HAS_W = " + (hw ? "true" : "false") + ", HAS_B = " + (hb ? "true" : "false") +
                      ";\n" + opt_params({{"w", hw}, {"b", hb}}, "KC_WB_PARAMS", "KC_WB_LOCALS") + kGroupHelpers +
                      kLnBody;
    const std::string Ms = "numel(out1)", Ns = "numel(input) / numel(out1)";
    std::vector<std::string> wb;
    if (hw) wb.push_back("ptr:weight");
    if (hb) wb.push_back("ptr:bias");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    json ls = json::array();
    json scratch = nullptr;
    if (split == 0) {
      ls.push_back(launch("kc_layer_norm", {row_grid(r, Ms)}, {r.g * r.rpb},
                          cat(cat({"ptr:out0", "ptr:out1", "ptr:out2", "ptr:input"}, wb),
                              {"i64:" + Ms, "i32:" + Ns, "f32:eps"})));
    } else {
      const std::string blocks = Ms + " * " + S(split);
      ls.push_back(launch("kc_layer_norm_part", {blocks}, {r.g}, {"ptr:part", "ptr:input", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split)}));
      ls.push_back(launch("kc_layer_norm_apply", {blocks}, {r.g},
                          cat(cat({"ptr:out0", "ptr:out1", "ptr:out2", "ptr:input"}, wb),
                              {"ptr:part", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split), "f32:eps"})));
      scratch = json::array({{{"name", "part"}, {"bytes", blocks + " * 8"}}});
    }
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls), std::move(scratch));
  }

 private:
  static bool defined(const TensorMeta* t) { return t && t->defined; }
  bool handles(const OpCall& c, int64_t& M, int64_t& N) const {
    if (c.backend != "cuda" || c.op != OpId::kLayerNorm || !c.dense()) return false;
    if (!ln_geometry(c, M, N)) return false;
    if (!ln_param_ok(c.input("weight"), N) || !ln_param_ok(c.input("bias"), N)) return false;
    if (c.outputs.size() != 3) return false;
    const TensorMeta* x = c.input("input");
    if (!c.outputs[0].defined || c.outputs[0].dtype != DType::kF32 || c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (!c.outputs[i].defined || c.outputs[i].dtype != DType::kF32 || c.outputs[i].numel() != M) return false;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Layer norm backward. grad_input per row: gi = rstd/N * (N*w*g - xhat*sum(w*g*xhat) - sum(w*g)),
// by row groups or split rows (partial sums in scratch, then every block of a row adds them in
// the same order). grad_weight / grad_bias: column sums over rows, by blocks of 32 x col_ty
// threads, each over a range of rows (col_split ranges; partials in scratch and a finishing launch
// that adds them in order when col_split > 1). Deterministic: no atomics.

const char* kLnBackBody = R"CU(
__device__ __forceinline__ void kc_acc(const V& g, const V& x, int i, float mu, float rs, const float* w, float& a, float& b) {
  V wv{};
  if constexpr (HAS_W) wv = reinterpret_cast<const V*>(w)[i];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float wg = HAS_W ? g.v[e] * wv.v[e] : g.v[e];
    a += wg;
    b += wg * ((x.v[e] - mu) * rs);
  }
}
__device__ __forceinline__ V kc_gi(const V& g, const V& x, int i, float mu, float rs, const float* w, float a, float b, float fN) {
  V wv{}, o;
  if constexpr (HAS_W) wv = reinterpret_cast<const V*>(w)[i];
  const float term1 = (1.f / fN) * rs;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    float f = HAS_W ? fN * wv.v[e] * g.v[e] : fN * g.v[e];
    f -= (x.v[e] - mu) * rs * b;
    f -= a;
    o.v[e] = f * term1;
  }
  return o;
}
__device__ __forceinline__ int kc_chunk(int N, int S) { return ((N + S - 1) / S + VEC - 1) / VEC * VEC; }

#if KC_GI
extern "C" __global__ void __launch_bounds__(NT) kc_lnb_rows(float* __restrict__ gi, const float* __restrict__ g,
    const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd KC_W_PARAMS, long long M, int N) {
  KC_W_LOCALS
  __shared__ float sh[64];
  const int t = G == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
  const long long row = (long long)blockIdx.x * RPB + threadIdx.x / G;
  if (row >= M) return;   // whole warps only (G == 32); a block row always exists
  const float mu = mean[row], rs = rstd[row], fN = (float)N;
  const V* gv = reinterpret_cast<const V*>(g + row * N);
  const V* xv = reinterpret_cast<const V*>(x + row * N);
  V* ov = reinterpret_cast<V*>(gi + row * N);
  const int nv = N / VEC;
  float a = 0.f, b = 0.f;
  if constexpr (ITEMS > 0) {
    V rg[ITEMS > 0 ? ITEMS : 1], rx[ITEMS > 0 ? ITEMS : 1];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) { rg[k] = gv[i]; rx[k] = xv[i]; kc_acc(rg[k], rx[k], i, mu, rs, w, a, b); }
    }
    kc_gsum2(a, b, sh);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = k * G + t;
      if (i < nv) ov[i] = kc_gi(rg[k], rx[k], i, mu, rs, w, a, b, fN);
    }
  } else {
    for (int i = t; i < nv; i += G) kc_acc(gv[i], xv[i], i, mu, rs, w, a, b);
    kc_gsum2(a, b, sh);
    for (int i = t; i < nv; i += G) ov[i] = kc_gi(gv[i], xv[i], i, mu, rs, w, a, b, fN);
  }
}

extern "C" __global__ void __launch_bounds__(NT) kc_lnb_part(float* __restrict__ part, const float* __restrict__ g,
    const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd KC_W_PARAMS, long long M,
    int N, int S) {
  KC_W_LOCALS
  __shared__ float sh[64];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const float mu = mean[row], rs = rstd[row];
  const V* gv = reinterpret_cast<const V*>(g + row * N);
  const V* xv = reinterpret_cast<const V*>(x + row * N);
  float a = 0.f, b = 0.f;
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) kc_acc(gv[i], xv[i], (int)i, mu, rs, w, a, b);
  kc_gsum2(a, b, sh);
  if (threadIdx.x == 0) { part[2 * (long long)blockIdx.x] = a; part[2 * (long long)blockIdx.x + 1] = b; }
}

extern "C" __global__ void __launch_bounds__(NT) kc_lnb_apply(float* __restrict__ gi, const float* __restrict__ g,
    const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd KC_W_PARAMS,
    const float* __restrict__ part, long long M, int N, int S) {
  KC_W_LOCALS
  __shared__ float sh[64];
  const long long row = blockIdx.x / S;
  const int c = blockIdx.x % S;
  const long long C = kc_chunk(N, S);
  const long long lo = c * C, hi = min((long long)N, lo + C);
  const float mu = mean[row], rs = rstd[row], fN = (float)N;
  const float* pr = part + 2 * row * S;
  float a = 0.f, b = 0.f;
  for (int p = threadIdx.x; p < S; p += NT) { a += pr[2 * p]; b += pr[2 * p + 1]; }
  kc_gsum2(a, b, sh);
  const V* gv = reinterpret_cast<const V*>(g + row * N);
  const V* xv = reinterpret_cast<const V*>(x + row * N);
  V* ov = reinterpret_cast<V*>(gi + row * N);
  for (long long i = lo / VEC + threadIdx.x; i < hi / VEC; i += NT) ov[i] = kc_gi(gv[i], xv[i], (int)i, mu, rs, w, a, b, fN);
}
#endif

#if KC_GW || KC_GB
struct alignas(sizeof(float) * CV) VC { float v[CV]; };
extern "C" __global__ void __launch_bounds__(32 * TY) kc_lnb_cols(KC_COL_OUT const float* __restrict__ g,
    const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd, long long M, int N) {
  KC_COL_LOCALS
  __shared__ float shw[KC_GW ? TY : 1][32 * CV], shb[KC_GB ? TY : 1][32 * CV];
  const int jv = blockIdx.x * 32 + threadIdx.x;
  const long long rps = (M + KC_R - 1) / KC_R;
  const long long r0 = blockIdx.y * rps, r1 = min(M, r0 + rps);
  float aw[CV], ab[CV];
#pragma unroll
  for (int e = 0; e < CV; ++e) { aw[e] = 0.f; ab[e] = 0.f; }
  if (jv < N / CV) {
    for (long long i = r0 + threadIdx.y; i < r1; i += TY) {
      const VC gg = reinterpret_cast<const VC*>(g + i * N)[jv];
      if constexpr (KC_GW) {
        const float mu = mean[i], rs = rstd[i];
        const VC xx = reinterpret_cast<const VC*>(x + i * N)[jv];
#pragma unroll
        for (int e = 0; e < CV; ++e) aw[e] += gg.v[e] * ((xx.v[e] - mu) * rs);
      }
#pragma unroll
      for (int e = 0; e < CV; ++e) ab[e] += gg.v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < CV; ++e) {
    if constexpr (KC_GW) shw[threadIdx.y][threadIdx.x * CV + e] = aw[e];
    if constexpr (KC_GB) shb[threadIdx.y][threadIdx.x * CV + e] = ab[e];
  }
  __syncthreads();
  for (int q = threadIdx.y * 32 + threadIdx.x; q < 32 * CV; q += 32 * TY) {
    const long long j = (long long)blockIdx.x * 32 * CV + q;
    if (j < N) {
      float sw = 0.f, sb = 0.f;
      for (int ty = 0; ty < TY; ++ty) {
        if constexpr (KC_GW) sw += shw[ty][q];
        if constexpr (KC_GB) sb += shb[ty][q];
      }
      const long long o = (KC_R > 1 ? (long long)blockIdx.y * N : 0LL) + j;
      if constexpr (KC_GW) pw[o] = sw;
      if constexpr (KC_GB) pb[o] = sb;
    }
  }
}
#if KC_R > 1
extern "C" __global__ void __launch_bounds__(256) kc_lnb_colsum(KC_SUM_OUT int N) {
  KC_SUM_LOCALS
  const int j = blockIdx.x * 256 + threadIdx.x;
  if (j >= N) return;
  float sw = 0.f, sb = 0.f;
  for (int r = 0; r < KC_R; ++r) {
    if constexpr (KC_GW) sw += pw[(long long)r * N + j];
    if constexpr (KC_GB) sb += pb[(long long)r * N + j];
  }
  if constexpr (KC_GW) gw[j] = sw;
  if constexpr (KC_GB) gb[j] = sb;
}
#endif
#endif
)CU";

class LayerNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cuda.layer_norm_backward"; }
  const char* backend() const override { return "cuda"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    int64_t M, N;
    bool gi, gw, gb;
    if (!handles(c, M, N, gi, gw, gb)) return {};
    std::vector<KnobDim> sp;
    if (gi) {
      row_space(sp, DType::kF32, N, true);
      auto splits = split_values(M, N);
      if (splits.front() != 0) sp[0].values = with_default(sp[0].values, 256);
      sp.push_back({"split", splits});
    }
    if (gw || gb) {
      auto cvs = vec_values(DType::kF32, N);
      const int64_t cv = cvs.back();
      int64_t ty = 1;
      while (ty < 8 && ty * 2 <= M) ty *= 2;
      const int64_t colblocks = cdiv(N, 32 * cv);
      int64_t rs = 1;
      while (rs < 256 && colblocks * rs < 2 * kSms && (rs * 2) * ty * 4 <= M) rs *= 2;
      sp.push_back({"col_ty", with_default({1, 2, 4, 8, 16, 32}, ty)});
      sp.push_back({"col_vec", with_default(cvs, cv)});
      sp.push_back({"col_split", with_default({1, 2, 4, 8, 16, 32, 64, 128, 256}, rs)});
    }
    return sp;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    auto sp = space(c);
    if (sp.empty()) return unsupported("cuda.layer_norm_backward does not handle this call");
    auto kr = pick(sp, kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    int64_t M = 0, N = 0;
    bool gi = false, gw = false, gb = false;
    handles(c, M, N, gi, gw, gb);
    const bool hw = c.input("weight") && c.input("weight")->defined;
    RowGeom r;
    int64_t split = 0, ty = 1, cv = 1, rsplit = 1;
    if (gi) {
      split = k["split"];
      if (split > 0) {
        k["regs"] = 0;
        k["rows"] = 1;
      }
      auto gr = row_geom(k, N);
      if (!gr.is_ok()) return gr.status();
      r = gr.value();
    }
    if (gw || gb) {
      ty = k["col_ty"];
      cv = k["col_vec"];
      rsplit = k["col_split"];
      if (N % cv != 0) return unsupported("col_vec " + S(cv) + " does not divide the row (" + S(N) + ")");
    }
    std::string src = "// kernelcraft cuda.layer_norm_backward f32\n" + dtype_prelude(DType::kF32) + row_consts(r) +
                      "constexpr bool HAS_W = " + (hw ? "true" : "false") + ";\nconstexpr int TY = " + S(ty) +
                      ", CV = " + S(cv) + ";\n#define KC_R " + S(rsplit) + "\n#define KC_GI " + S(gi) + "\n#define KC_GW " +
                      S(gw) + "\n#define KC_GB " + S(gb) + "\n" + opt_params({{"w", hw}}, "KC_W_PARAMS", "KC_W_LOCALS");
    // Column kernels: outputs (or partials) first, absent ones replaced by null locals.
    const bool part = rsplit > 1;
    auto outs = [&](const char* m1, const char* m2, const std::string& w, const std::string& b) {
      std::string p = "#define " + std::string(m1), l = "#define " + std::string(m2);
      for (const auto& [n, on] : std::vector<std::pair<std::string, bool>>{{w, gw}, {b, gb}}) {
        if (on) p += " float* __restrict__ " + n + ",";
        else l += " float* " + n + " = nullptr; (void)" + n + ";";
      }
      return p + "\n" + l + "\n";
    };
    src += outs("KC_COL_OUT", "KC_COL_LOCALS", "pw", "pb");
    if (part) {
      src += "#define KC_SUM_OUT";
      if (gw) src += " float* __restrict__ gw,";
      if (gb) src += " float* __restrict__ gb,";
      if (gw) src += " const float* __restrict__ pw,";
      if (gb) src += " const float* __restrict__ pb,";
      src += "\n#define KC_SUM_LOCALS";
      if (!gw) src += " float* gw = nullptr; const float* pw = nullptr; (void)gw; (void)pw;";
      if (!gb) src += " float* gb = nullptr; const float* pb = nullptr; (void)gb; (void)pb;";
      src += "\n";
    }
    src += std::string(kGroupHelpers) + kLnBackBody;

    const std::string Ms = "numel(mean)", Ns = "numel(input) / numel(mean)";
    std::vector<std::string> common = {"ptr:grad_out", "ptr:input", "ptr:mean", "ptr:rstd"};
    if (hw) common.push_back("ptr:weight");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    json ls = json::array(), scratch = json::array();
    if (gi && split == 0) {
      ls.push_back(launch("kc_lnb_rows", {row_grid(r, Ms)}, {r.g * r.rpb},
                          cat(cat({"ptr:out0"}, common), {"i64:" + Ms, "i32:" + Ns})));
    } else if (gi) {
      const std::string blocks = Ms + " * " + S(split);
      ls.push_back(launch("kc_lnb_part", {blocks}, {r.g}, cat(cat({"ptr:part"}, common), {"i64:" + Ms, "i32:" + Ns, "i32:" + S(split)})));
      ls.push_back(launch("kc_lnb_apply", {blocks}, {r.g},
                          cat(cat({"ptr:out0"}, common), {"ptr:part", "i64:" + Ms, "i32:" + Ns, "i32:" + S(split)})));
      scratch.push_back({{"name", "part"}, {"bytes", blocks + " * 8"}});
    }
    if (gw || gb) {
      std::vector<std::string> o;
      if (gw) o.push_back(part ? "ptr:pw" : "ptr:out1");
      if (gb) o.push_back(part ? "ptr:pb" : "ptr:out2");
      ls.push_back(launch("kc_lnb_cols", {"ceil_div(" + Ns + ", " + S(32 * cv) + ")", rsplit}, {32, ty},
                          cat(o, {"ptr:grad_out", "ptr:input", "ptr:mean", "ptr:rstd", "i64:" + Ms, "i32:" + Ns})));
      if (part) {
        std::vector<std::string> a;
        if (gw) a.push_back("ptr:out1");
        if (gb) a.push_back("ptr:out2");
        if (gw) a.push_back("ptr:pw");
        if (gb) a.push_back("ptr:pb");
        a.push_back("i32:" + Ns);
        ls.push_back(launch("kc_lnb_colsum", {"ceil_div(" + Ns + ", 256)"}, {256}, a));
        if (gw) scratch.push_back({{"name", "pw"}, {"bytes", S(rsplit * 4) + " * " + Ns}});
        if (gb) scratch.push_back({{"name", "pb"}, {"bytes", S(rsplit * 4) + " * " + Ns}});
      }
    }
    return make_candidate(name(), std::move(k), std::move(src), std::move(ls),
                          scratch.empty() ? json(nullptr) : std::move(scratch));
  }

 private:
  bool handles(const OpCall& c, int64_t& M, int64_t& N, bool& gi, bool& gw, bool& gb) const {
    if (c.backend != "cuda" || c.op != OpId::kLayerNormBackward || !c.dense()) return false;
    if (!ln_geometry(c, M, N)) return false;
    const TensorMeta* x = c.input("input");
    const TensorMeta* g = c.input("grad_out");
    if (!tensor_ok(g, DType::kF32) || g->sizes != x->sizes) return false;
    for (const char* s : {"mean", "rstd"}) {
      const TensorMeta* t = c.input(s);
      if (!tensor_ok(t, DType::kF32) || t->numel() != M) return false;
    }
    if (!ln_param_ok(c.input("weight"), N)) return false;
    if (c.outputs.size() != 3) return false;
    gi = c.outputs[0].defined;
    gw = c.outputs[1].defined;
    gb = c.outputs[2].defined;
    if (!gi && !gw && !gb) return false;
    if (gi && (c.outputs[0].dtype != DType::kF32 || c.outputs[0].sizes != x->sizes)) return false;
    for (int i = 1; i < 3; ++i)
      if (c.outputs[i].defined && (c.outputs[i].dtype != DType::kF32 || c.outputs[i].numel() != N)) return false;
    return true;
  }
};

}  // namespace

const std::vector<const Template*>& cuda_templates() {
  static const ElementwiseTemplate unary(false), unary_backward(true);
  static const SoftmaxTemplate softmax(false), softmax_backward(true);
  static const LayerNormTemplate layer_norm;
  static const LayerNormBackwardTemplate layer_norm_backward;
  static const std::vector<const Template*> v = {&unary, &unary_backward, &softmax, &softmax_backward,
                                                 &layer_norm, &layer_norm_backward};
  return v;
}

}  // namespace kc::evolve
