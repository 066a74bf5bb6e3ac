// CPU op-family templates: C++ sources for the CPU kernel ABI (runtime/cpu_backend.h, kc_cpu.h)
// plus their launch specs. fp32, contiguous (OpCall::dense()) calls only.
//
// Every source depends only on the op, which optional tensors are present and the code-shaping
// knobs (unroll, simd, acc, stats); shapes and work splits (elements or rows per block, row
// splitting, how weight/bias gradients are reduced) travel in the launch spec (block[0] hints
// and i64 arguments), so one compiled source serves every shape and split of a variant.
//
// Families and knobs (the first value of each knob is the default):
//   cpu.unary            relu gelu(none|tanh) silu sigmoid tanh
//                        elems (elements per block), unroll (1 2 4 8), simd (restrict + ivdep),
//                        vexp (exp-based ops: 0 libm expf, 1 an inline exp the compiler vectorizes)
//   cpu.unary_backward   threshold_backward gelu_backward silu_backward sigmoid_backward
//                        tanh_backward; same knobs
//   cpu.softmax          _softmax _log_softmax over the last dim: rows (rows per block),
//                        unroll (independent accumulator lanes), acc (1: double, 0: float with
//                        Kahan compensation), simd, vexp
//   cpu.softmax_backward _softmax_backward_data _log_softmax_backward_data; same knobs (vexp for
//                        the log variant only)
//   cpu.layer_norm       native_layer_norm: rows, split (0: one block per row range; else a row is
//                        cut into chunks of this many elements: partial moments into scratch,
//                        then a second launch combines them (Chan) and normalizes), stats
//                        (0: two-pass, 1: shifted one-pass in double), acc, unroll, simd
//   cpu.layer_norm_backward native_layer_norm_backward: rows, split (as above, for grad_input),
//                        wb_rows (0: weight/bias grads by a column-blocked launch; R: partial
//                        column sums over R-row slabs in scratch + a finishing launch),
//                        wb_cols (columns per block of those launches), acc, unroll, simd
// All reductions run in a fixed order, so results do not depend on how blocks are threaded.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "evolve/proposer.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

Status unsupported(const std::string& m) { return Status::error(Code::kUnsupported, m); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

std::string str(int64_t v) { return std::to_string(v); }

// fp32 everywhere, contiguous and aligned, on the CPU backend.
bool dense_f32(const OpCall& c) {
  if (c.backend != "cpu" || !c.dense()) return false;
  for (const auto& t : c.inputs)
    if (t.defined && t.dtype != DType::kF32) return false;
  for (const auto& t : c.outputs)
    if (t.defined && t.dtype != DType::kF32) return false;
  return !c.outputs.empty();
}

const TensorMeta* defined_input(const OpCall& c, const std::string& name) {
  const TensorMeta* t = c.input(name);
  return t && t->defined ? t : nullptr;
}

bool same_sizes(const TensorMeta* a, const TensorMeta* b) { return a && b && a->sizes == b->sizes; }

// `order` with `dflt` moved to the front (the template's default is the first value).
std::vector<int64_t> default_first(std::vector<int64_t> order, int64_t dflt) {
  auto it = std::find(order.begin(), order.end(), dflt);
  if (it != order.end()) order.erase(it);
  order.insert(order.begin(), dflt);
  return order;
}

// Work sizes (ascending `all`) worth trying for `total` items: every value below it and the
// smallest one covering it (larger ones would all make the same single block).
std::vector<int64_t> useful_sizes(const std::vector<int64_t>& all, int64_t total) {
  std::vector<int64_t> v;
  for (int64_t x : all) {
    v.push_back(x);
    if (x >= total) break;
  }
  return v;
}

// The largest useful value not above `target` (or the smallest useful value).
int64_t pick_default(const std::vector<int64_t>& useful, int64_t target) {
  int64_t d = useful.front();
  for (int64_t x : useful)
    if (x <= target) d = x;
  return d;
}

const std::vector<int64_t> kElems = {1024, 2048, 4096, 8192, 16384, 32768, 65536};
const std::vector<int64_t> kRows = {1, 2, 4, 8, 16, 32, 64};
const std::vector<int64_t> kSplit = {16384, 65536, 262144, 1048576};
const std::vector<int64_t> kUnroll = {4, 1, 2, 8};
const std::vector<int64_t> kOnOff = {1, 0};

std::vector<int64_t> elems_values(int64_t n) {
  auto u = useful_sizes(kElems, n);
  return default_first(u, pick_default(u, 16384));
}

// Rows per block: about 16K elements per block by default.
std::vector<int64_t> rows_values(int64_t rows, int64_t n) {
  auto u = useful_sizes(kRows, rows);
  return default_first(u, pick_default(u, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1))));
}

// Row splitting for long rows: 0 (off) or a chunk length that cuts the row at least in two. On by
// default only when there are too few rows to keep threads busy and the rows are long.
std::vector<int64_t> split_values(int64_t rows, int64_t n) {
  std::vector<int64_t> v = {0};
  for (int64_t s : kSplit)
    if (n >= 2 * s) v.push_back(s);
  int64_t dflt = (rows < 32 && n >= 2 * 65536) ? 65536 : 0;
  return default_first(v, dflt);
}

// Checks `k` against `space`: unknown knobs and values outside the space are kUnsupported; missing
// knobs take their default. The result names every knob of the space.
Result<Knobs> settle(const std::vector<KnobDim>& space, const Knobs& k) {
  if (space.empty()) return unsupported("this template does not handle the call");
  Knobs out;
  for (const auto& [name, v] : k) {
    auto d = std::find_if(space.begin(), space.end(), [&](const KnobDim& x) { return x.name == name; });
    if (d == space.end()) return unsupported("unknown knob '" + name + "'");
    if (std::find(d->values.begin(), d->values.end(), v) == d->values.end())
      return unsupported("knob " + name + "=" + str(v) + " is not valid for this call");
  }
  for (const auto& d : space) {
    auto it = k.find(d.name);
    out[d.name] = it == k.end() ? d.values.front() : it->second;
  }
  return out;
}

// Argument lists: each parameter appends its launch-spec string and its C++ declaration.
struct Args {
  json spec = json::array();
  std::string decl;
  bool restrict_ptrs = false;
  int n = 0;
  void ptr(const std::string& ctype, const std::string& var, const std::string& what) {
    decl += "  " + ctype + (restrict_ptrs ? " __restrict " : " ") + var + " = KC_ARG(" + ctype + ", args, " +
            str(n++) + ");\n";
    spec.push_back("ptr:" + what);
  }
  void nullptr_decl(const std::string& ctype, const std::string& var) {
    decl += "  " + ctype + " " + var + " = 0;\n";
  }
  void i64(const std::string& var, const std::string& expr) {
    decl += "  const int64_t " + var + " = KC_ARG(int64_t, args, " + str(n++) + ");\n";
    spec.push_back("i64:" + expr);
  }
  void f32(const std::string& var, const std::string& what) {
    decl += "  const float " + var + " = KC_ARG(float, args, " + str(n++) + ");\n";
    spec.push_back("f32:" + what);
  }
  void f64(const std::string& var, const std::string& what) {
    decl += "  const double " + var + " = KC_ARG(double, args, " + str(n++) + ");\n";
    spec.push_back("f64:" + what);
  }
};

json launch(const std::string& entry, const std::string& grid, int64_t block, const json& args) {
  return {{"entry", entry}, {"grid", {grid, 1, 1}}, {"block", {block, 1, 1}}, {"smem", 0}, {"args", args}};
}

// "extern C" kernel text: `body` with @ENTRY@, @ARGS@ (declarations) substituted.
std::string kernel(const std::string& entry, const Args& a, const std::string& body) {
  return "extern \"C\" void " + entry + "(const kc_cpu_ctx* ctx, void* const* args) {\n" + a.decl + body + "}\n";
}

std::string ivdep(bool simd) { return simd ? "#pragma GCC ivdep\n" : ""; }

// kc_exp(x): libm expf (vexp=0), or an inline exp the compiler can vectorize (vexp=1): Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2/2, a degree-7 Taylor polynomial for e^r (truncation 5e-9
// relative), and 2^n applied in two exact power-of-two steps so overflow gives inf and tiny results
// round once into the denormal range. NaN propagates, -inf gives 0, +inf gives inf; about 1-2 ulp.
std::string exp_fn(bool vexp) {
  if (!vexp) return "static inline float kc_exp(float x) { return expf(x); }\n";
  return R"K(static inline float kc_exp(float x) {
  const float xc = x < -104.0f ? -104.0f : (x > 88.75f ? 88.75f : x);
  const float t = xc * 1.44269504088896341f + 12582912.0f;   /* round(x / ln2) via 1.5 * 2^23 */
  const float n = t - 12582912.0f;
  int32_t ti, mi;
  const float magic = 12582912.0f;
  __builtin_memcpy(&ti, &t, 4);
  __builtin_memcpy(&mi, &magic, 4);
  const int32_t ni = ti - mi;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606820309417232e-06f;
  float p = 1.98412698412698413e-4f;
  p = p * r + 1.38888888888888889e-3f;
  p = p * r + 8.33333333333333333e-3f;
  p = p * r + 4.16666666666666667e-2f;
  p = p * r + 1.66666666666666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  const int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &b1, 4);
  __builtin_memcpy(&s2, &b2, 4);
  return (p * s1) * s2;
}
)K";
}

// Ops whose cost is exp: they get the vexp knob.
bool exp_op(OpId op) {
  return op == OpId::kSilu || op == OpId::kSigmoid || op == OpId::kSiluBackward || op == OpId::kSoftmax ||
         op == OpId::kLogSoftmax || op == OpId::kLogSoftmaxBackward;
}

// Knobs that shape the code; the others only change the launch spec, so they stay out of the
// source text (one compiled source serves every work split).
bool shapes_code(const std::string& knob) {
  return knob == "unroll" || knob == "simd" || knob == "acc" || knob == "stats" || knob == "vexp";
}

// Common head of every source: provenance comment, unroll factor, restrict spelling.
std::string head(const char* family, const std::string& what, const Knobs& k) {
  std::string s = "// kernelcraft " + std::string(family) + ": " + what + ";";
  for (const auto& [n, v] : k)
    if (shapes_code(n)) s += " " + n + "=" + str(v);
  s += "\n#define KC_U " + str(k.count("unroll") ? k.at("unroll") : 1) + "\n";
  s += std::string("#define KC_RS ") + (k.count("simd") && k.at("simd") ? "__restrict" : "") + "\n";
  return s;
}

// Accumulators for reductions: double, or float with Kahan compensation (a few ulp for any n).
// kc_acc_t is the type products are formed in before they are added.
std::string accumulators(bool dbl) {
  std::string s;
  if (dbl) {
    s = "typedef double kc_acc_t;\n"
        "struct kc_sum {\n"
        "  double s;\n"
        "  inline void add(double v) { s += v; }\n"
        "  inline double get() const { return s; }\n"
        "};\n";
  } else {
    s = "typedef float kc_acc_t;\n"
        "struct kc_sum {  /* Kahan-compensated float sum */\n"
        "  float s, c;\n"
        "  inline void add(float v) { const float y = v - c; const float t = s + y; c = (t - s) - y; s = t; }\n"
        "  inline double get() const { return (double)s - (double)c; }\n"
        "};\n";
  }
  s += "static inline double kc_total(const kc_sum* a) {\n"
       "  double t = 0;\n"
       "  for (int u = 0; u < KC_U; ++u) t += a[u].get();\n"
       "  return t;\n"
       "}\n";
  return s;
}

Candidate candidate(const char* family, Knobs k, std::string source, json launches, json scratch = json()) {
  Candidate c;
  c.family = family;
  c.knobs = std::move(k);
  c.source = std::move(source);
  c.launch = {{"version", 1}, {"launches", std::move(launches)}};
  if (!scratch.is_null() && !scratch.empty()) c.launch["scratch"] = std::move(scratch);
  return c;
}

// ---------------------------------------------------------------------------------------------
// cpu.unary and cpu.unary_backward: one element-wise loop over [0, numel) in blocks of `elems`.

constexpr const char* kGeluTanhConsts =
    "static const float kc_beta = 0.7978845608028654f;   /* sqrt(2/pi) */\n"
    "static const float kc_kappa = 0.044715f;\n";

// The scalar function of an element-wise op, or "" when the call's variant is not handled.
std::string unary_fn(const OpCall& c) {
  switch (c.op) {
    case OpId::kRelu:
      return "static inline float kc_op(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }\n";
    case OpId::kGelu: {
      std::string a = c.string_arg("approximate", "none");
      if (a == "none")
        return "static inline float kc_op(float x) {\n"
               "  return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f));\n"
               "}\n";
      if (a == "tanh")
        return std::string(kGeluTanhConsts) +
               "static inline float kc_op(float x) {\n"
               "  const float inner = kc_beta * (x + kc_kappa * (x * x * x));\n"
               "  return 0.5f * x * (1.0f + tanhf(inner));\n"
               "}\n";
      return "";
    }
    case OpId::kSilu: return "static inline float kc_op(float x) { return x / (1.0f + kc_exp(-x)); }\n";
    case OpId::kSigmoid: return "static inline float kc_op(float x) { return 1.0f / (1.0f + kc_exp(-x)); }\n";
    case OpId::kTanh: return "static inline float kc_op(float x) { return tanhf(x); }\n";
    default: return "";
  }
}

// kc_op(g, x, p): g the incoming gradient, x the saved tensor, p the threshold (threshold only).
std::string unary_backward_fn(const OpCall& c) {
  switch (c.op) {
    case OpId::kReluBackward:
      return "static inline float kc_op(float g, float x, float p) { return x <= p ? 0.0f : g; }\n";
    case OpId::kGeluBackward: {
      std::string a = c.string_arg("approximate", "none");
      if (a == "none")
        return "static inline float kc_op(float g, float x, float p) {\n"
               "  (void)p;\n"
               "  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));\n"
               "  const float pdf = 0.3989422804014327f * expf(x * x * -0.5f);   /* 1/sqrt(2 pi) */\n"
               "  return g * (cdf + x * pdf);\n"
               "}\n";
      if (a == "tanh")
        return std::string(kGeluTanhConsts) +
               "static inline float kc_op(float g, float x, float p) {\n"
               "  (void)p;\n"
               "  const float x_sq = x * x;\n"
               "  const float inner = kc_beta * (x + kc_kappa * (x_sq * x));\n"
               "  const float t = tanhf(inner);\n"
               "  const float left = 0.5f * x;\n"
               "  const float right = 1.0f + t;\n"
               "  const float left_derivative = 0.5f * right;\n"
               "  const float right_derivative = 1.0f - t * t;\n"
               "  const float inner_derivative = kc_beta * (1.0f + 3.0f * kc_kappa * x_sq);\n"
               "  return g * (left_derivative + left * right_derivative * inner_derivative);\n"
               "}\n";
      return "";
    }
    case OpId::kSiluBackward:
      return "static inline float kc_op(float g, float x, float p) {\n"
             "  (void)p;\n"
             "  const float s = 1.0f / (1.0f + kc_exp(-x));\n"
             "  return g * s * (1.0f + x * (1.0f - s));\n"
             "}\n";
    case OpId::kSigmoidBackward:
      return "static inline float kc_op(float g, float y, float p) { (void)p; return g * (1.0f - y) * y; }\n";
    case OpId::kTanhBackward:
      return "static inline float kc_op(float g, float y, float p) { (void)p; return g * (1.0f - y * y); }\n";
    default: return "";
  }
}

// The saved-tensor argument name of a backward op ("self" or "output").
const char* saved_name(OpId op) {
  return (op == OpId::kSigmoidBackward || op == OpId::kTanhBackward) ? "output" : "self";
}

class UnaryTemplate : public Template {
 public:
  explicit UnaryTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cpu.unary_backward" : "cpu.unary"; }
  const char* backend() const override { return "cpu"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    if (!handles(c)) return {};
    std::vector<KnobDim> s = {{"elems", elems_values(lead(c)->numel())}, {"unroll", kUnroll}, {"simd", kOnOff}};
    if (exp_op(c.op)) s.push_back({"vexp", {0, 1}});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const int64_t elems = k->at("elems");
    const bool simd = k->at("simd") != 0;
    const std::string fn = backward_ ? unary_backward_fn(c) : unary_fn(c);
    const std::string opname = op_info(c.op).name;
    const std::string entry = "kc_cpu_" + opname;
    const std::string lead_name = backward_ ? "grad_output" : "self";
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("float*", "out", "out0");
    std::string body;
    if (!backward_) {
      a.ptr("const float*", "x", "self");
      a.i64("n", "numel(self)");
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    int64_t i = lo;
@IVDEP@    for (; i + KC_U <= hi; i += KC_U) {
      for (int u = 0; u < KC_U; ++u) out[i + u] = kc_op(x[i + u]);
    }
    for (; i < hi; ++i) out[i] = kc_op(x[i]);
  }
)K";
    } else {
      a.ptr("const float*", "g", "grad_output");
      a.ptr("const float*", "x", saved_name(c.op));
      a.i64("n", "numel(grad_output)");
      if (c.op == OpId::kReluBackward) a.f32("p", "threshold");
      else a.decl += "  const float p = 0.0f;\n";
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t lo = b * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    int64_t i = lo;
@IVDEP@    for (; i + KC_U <= hi; i += KC_U) {
      for (int u = 0; u < KC_U; ++u) out[i + u] = kc_op(g[i + u], x[i + u], p);
    }
    for (; i < hi; ++i) out[i] = kc_op(g[i], x[i], p);
  }
)K";
    }
    std::string what = opname;
    if (c.op == OpId::kGelu || c.op == OpId::kGeluBackward) what += " approximate=" + c.string_arg("approximate", "none");
    const bool vexp = k->count("vexp") && k->at("vexp");
    std::string src = head(name(), what, k.value()) + (exp_op(c.op) ? exp_fn(vexp) : "") + fn +
                      kernel(entry, a, replace_all(body, "@IVDEP@", ivdep(simd)));
    json l = json::array({launch(entry, "ceil_div(numel(" + lead_name + "), " + str(elems) + ")", elems, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  bool backward_;

  const TensorMeta* lead(const OpCall& c) const { return defined_input(c, backward_ ? "grad_output" : "self"); }

  bool handles(const OpCall& c) const {
    if (!dense_f32(c)) return false;
    const TensorMeta* x = lead(c);
    if (!x || x->numel() <= 0 || c.outputs[0].numel() != x->numel() || !c.outputs[0].defined) return false;
    if (!backward_) {
      if (op_info(c.op).family != OpFamily::kUnary) return false;
      return !unary_fn(c).empty();
    }
    if (op_info(c.op).family != OpFamily::kUnaryBackward) return false;
    if (!same_sizes(x, defined_input(c, saved_name(c.op)))) return false;
    if (c.op == OpId::kReluBackward) {
      const ScalarArg* t = c.scalar("threshold");
      if (!t) return false;
      if (const double* d = std::get_if<double>(&t->value)) {
        if (std::isfinite(*d) && std::fabs(*d) > 3.4028234663852886e38) return false;  // not a float
      } else if (!std::holds_alternative<int64_t>(t->value)) {
        return false;
      }
    }
    return !unary_backward_fn(c).empty();
  }
};

// ---------------------------------------------------------------------------------------------
// Row-wise families share this: the last dim of `t` is a row of n elements, rows = numel / n.
struct Rows {
  int64_t rows = 0, n = 0;
};

// _softmax/_log_softmax and their backward: dim must be the last one (may be negative).
bool last_dim(const OpCall& c, const TensorMeta& t) {
  const int64_t nd = static_cast<int64_t>(t.sizes.size());
  if (nd == 0) return false;
  int64_t d = c.int_arg("dim", -1);
  if (d < 0) d += nd;
  return d == nd - 1;
}

const char* kMaxFn = "static inline float kc_max(float m, float v) { return (v > m || v != v) ? v : m; }\n";

class SoftmaxTemplate : public Template {
 public:
  explicit SoftmaxTemplate(bool backward) : backward_(backward) {}
  const char* name() const override { return backward_ ? "cpu.softmax_backward" : "cpu.softmax"; }
  const char* backend() const override { return "cpu"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    std::vector<KnobDim> s = {{"rows", rows_values(r.rows, r.n)}, {"unroll", kUnroll}, {"acc", kOnOff}, {"simd", kOnOff}};
    if (exp_op(c.op)) s.push_back({"vexp", {0, 1}});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    const bool is_log = c.op == OpId::kLogSoftmax || c.op == OpId::kLogSoftmaxBackward;
    const std::string opname = op_info(c.op).name;
    const std::string entry = "kc_cpu_" + opname;
    const std::string lead_name = backward_ ? "grad_output" : "self";
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("float*", "out", "out0");
    std::string body;
    if (!backward_) {
      a.ptr("const float*", "in", "self");
      a.i64("rows", "numel(self) / size(self,-1)");
      a.i64("n", "size(self,-1)");
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* KC_RS x = in + r * n;
      float* KC_RS y = out + r * n;
      float mx[KC_U];
      for (int u = 0; u < KC_U; ++u) mx[u] = -INFINITY;
      int64_t j = 0;
      for (; j + KC_U <= n; j += KC_U)
        for (int u = 0; u < KC_U; ++u) mx[u] = kc_max(mx[u], x[j + u]);
      for (; j < n; ++j) mx[0] = kc_max(mx[0], x[j]);
      float m = mx[0];
      for (int u = 1; u < KC_U; ++u) m = kc_max(m, mx[u]);
      kc_sum s[KC_U] = {};
@PASS2@    }
  }
)K";
      // exp(x - max) into y (a plain map, vectorizable), then its sum in KC_U lanes.
      body = replace_all(body, "@PASS2@", R"K(@IVDEP@      for (j = 0; j < n; ++j) y[j] = kc_exp(x[j] - m);
      j = 0;
      for (; j + KC_U <= n; j += KC_U)
        for (int u = 0; u < KC_U; ++u) s[u].add(y[j + u]);
      for (; j < n; ++j) s[0].add(y[j]);
@PASS3@)K");
      if (!is_log) {
        body = replace_all(body, "@PASS3@", R"K(      const float inv = (float)(1.0 / kc_total(s));
@IVDEP@      for (j = 0; j < n; ++j) y[j] *= inv;
)K");
      } else {
        body = replace_all(body, "@PASS3@", R"K(      const float ls = (float)log(kc_total(s));
@IVDEP@      for (j = 0; j < n; ++j) y[j] = (x[j] - m) - ls;
)K");
      }
    } else {
      a.ptr("const float*", "gin", "grad_output");
      a.ptr("const float*", "yin", "output");
      a.i64("rows", "numel(grad_output) / size(grad_output,-1)");
      a.i64("n", "size(grad_output,-1)");
      body = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* KC_RS g = gin + r * n;
      const float* KC_RS y = yin + r * n;
      float* KC_RS o = out + r * n;
      kc_sum s[KC_U] = {};
      int64_t j = 0;
      for (; j + KC_U <= n; j += KC_U)
        for (int u = 0; u < KC_U; ++u) s[u].add(@TERM@);
      for (; j < n; ++j) {
        const int u = 0;
        s[u].add(@TERM@);
      }
      const float sf = (float)kc_total(s);
@IVDEP@      for (j = 0; j < n; ++j) o[j] = @OUT@;
    }
  }
)K";
      if (!is_log) {
        body = replace_all(body, "@TERM@", "(kc_acc_t)g[j + u] * (kc_acc_t)y[j + u]");
        body = replace_all(body, "@OUT@", "y[j] * (g[j] - sf)");
      } else {
        body = replace_all(body, "@TERM@", "g[j + u]");
        body = replace_all(body, "@OUT@", "g[j] - kc_exp(y[j]) * sf");
      }
    }
    body = replace_all(body, "@IVDEP@", ivdep(simd));
    std::string src = head(name(), opname, k.value()) + accumulators(k->at("acc") != 0) + kMaxFn +
                      (exp_op(c.op) ? exp_fn(k->count("vexp") && k->at("vexp")) : "") + kernel(entry, a, body);
    const int64_t per = k->at("rows");
    const std::string rows_expr = "numel(" + lead_name + ") / size(" + lead_name + ",-1)";
    json l = json::array({launch(entry, "ceil_div(" + rows_expr + ", " + str(per) + ")", per, a.spec)});
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  bool backward_;

  bool handles(const OpCall& c, Rows& r) const {
    if (!dense_f32(c)) return false;
    const OpFamily fam = op_info(c.op).family;
    if (fam != (backward_ ? OpFamily::kSoftmaxBackward : OpFamily::kSoftmax)) return false;
    const TensorMeta* x = defined_input(c, backward_ ? "grad_output" : "self");
    if (!x || x->numel() <= 0 || !last_dim(c, *x)) return false;
    if (!c.outputs[0].defined || c.outputs[0].sizes != x->sizes) return false;
    if (backward_) {
      if (!same_sizes(x, defined_input(c, "output"))) return false;
      if (c.string_arg("input_dtype", "f32") != "f32") return false;
    } else {
      const ScalarArg* h = c.scalar("half_to_float");
      if (h) {
        const bool* hb = std::get_if<bool>(&h->value);
        const int64_t* hi = std::get_if<int64_t>(&h->value);
        if ((hb && *hb) || (hi && *hi) || (!hb && !hi)) return false;
      }
    }
    r.n = x->sizes.back();
    r.rows = x->numel() / r.n;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Layer norm: rows of n = prod(normalized_shape) elements.

// Rows and row length of a layer-norm call; false when shapes do not fit together.
bool ln_rows(const OpCall& c, const TensorMeta& x, Rows& r) {
  const std::vector<int64_t> ns = c.list_arg("normalized_shape");
  if (ns.size() > x.sizes.size()) return false;
  const size_t axis = x.sizes.size() - ns.size();
  int64_t n = 1;
  for (size_t i = 0; i < ns.size(); ++i) {
    if (x.sizes[axis + i] != ns[i]) return false;
    n *= ns[i];
  }
  if (n <= 0 || x.numel() <= 0) return false;
  r.n = n;
  r.rows = x.numel() / n;
  return true;
}

// Mean and sum of squared deviations of x[0, n) (n >= 1): two-pass (mean, then deviations
// from it) or a one-pass sum of (x - x[0]) and its squares in double.
const char* kMoments = R"K(static inline void kc_moments(const float* KC_RS x, int64_t n, double* mean, double* m2) {
#if KC_ONEPASS
  const double k = x[0];
  double s1[KC_U] = {}, s2[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const double d = (double)x[j + u] - k;
      s1[u] += d;
      s2[u] += d * d;
    }
  for (; j < n; ++j) {
    const double d = (double)x[j] - k;
    s1[0] += d;
    s2[0] += d * d;
  }
  double t1 = 0, t2 = 0;
  for (int u = 0; u < KC_U; ++u) {
    t1 += s1[u];
    t2 += s2[u];
  }
  *mean = k + t1 / (double)n;
  const double q = t2 - t1 * (t1 / (double)n);
  *m2 = q < 0 ? 0 : q;
#else
  kc_sum s[KC_U] = {};
  int64_t j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) s[u].add(x[j + u]);
  for (; j < n; ++j) s[0].add(x[j]);
  const double mu = kc_total(s) / (double)n;
  const float mf = (float)mu;
  (void)mf;
  kc_sum q[KC_U] = {};
  j = 0;
  for (; j + KC_U <= n; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const kc_acc_t d = KC_DEV(x[j + u], mu, mf);
      q[u].add(d * d);
    }
  for (; j < n; ++j) {
    const kc_acc_t d = KC_DEV(x[j], mu, mf);
    q[0].add(d * d);
  }
  *mean = mu;
  *m2 = kc_total(q);
#endif
}
)K";

class LayerNormTemplate : public Template {
 public:
  const char* name() const override { return "cpu.layer_norm"; }
  const char* backend() const override { return "cpu"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    return {{"rows", rows_values(r.rows, r.n)}, {"split", split_values(r.rows, r.n)}, {"stats", {0, 1}},
            {"acc", kOnOff}, {"unroll", kUnroll}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool acc_double = k->at("acc") != 0, onepass = k->at("stats") != 0, simd = k->at("simd") != 0;
    if (onepass && !acc_double) return unsupported("the one-pass moments need double accumulation");
    const bool has_w = defined_input(c, "weight") != nullptr, has_b = defined_input(c, "bias") != nullptr;
    const int64_t split = k->at("split");
    const std::string chunk = str(std::max<int64_t>(split, 1));

    std::string src = head(name(), std::string("native_layer_norm weight=") + (has_w ? "yes" : "no") +
                                        " bias=" + (has_b ? "yes" : "no"), k.value());
    src += "#define KC_ONEPASS " + str(onepass ? 1 : 0) + "\n";
    src += acc_double ? "#define KC_DEV(x, md, mf) ((double)(x) - (md))\n" : "#define KC_DEV(x, md, mf) ((x) - (mf))\n";
    src += accumulators(acc_double);
    src += kMoments;
    std::string affine = "(x[j] - mf) * rf";
    if (has_w) affine = "(" + affine + ") * w[j]";
    if (has_b) affine += " + bb[j]";
    src += "static inline void kc_normalize(const float* KC_RS x, float* KC_RS y, const float* KC_RS w,\n"
           "                                const float* KC_RS bb, int64_t j0, int64_t j1, float mf, float rf) {\n"
           "  (void)w;\n  (void)bb;\n" +
           ivdep(simd) + "  for (int64_t j = j0; j < j1; ++j) y[j] = " + affine + ";\n}\n";

    const std::string n_expr = "numel(input) / numel(out1)";
    // The row kernel: a block is a range of whole rows.
    Args a;
    a.restrict_ptrs = simd;
    auto common = [&](Args& x) {
      x.ptr("float*", "out", "out0");
      x.ptr("float*", "mean_out", "out1");
      x.ptr("float*", "rstd_out", "out2");
      x.ptr("const float*", "in", "input");
      if (has_w) x.ptr("const float*", "w", "weight");
      else x.nullptr_decl("const float*", "w");
      if (has_b) x.ptr("const float*", "bb", "bias");
      else x.nullptr_decl("const float*", "bb");
    };
    common(a);
    a.i64("rows", "numel(out1)");
    a.i64("n", n_expr);
    a.f64("eps", "eps");
    src += kernel("kc_cpu_layer_norm_rows", a, R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      double mean, m2;
      kc_moments(in + r * n, n, &mean, &m2);
      const double rstd = 1.0 / sqrt(m2 / (double)n + eps);
      mean_out[r] = (float)mean;
      rstd_out[r] = (float)rstd;
      kc_normalize(in + r * n, out + r * n, w, bb, 0, n, (float)mean, (float)rstd);
    }
  }
)K");
    // Split rows: partial moments per chunk, then every chunk combines its row's partials in the
    // same order (so all chunks agree) and normalizes itself.
    Args p;
    p.restrict_ptrs = simd;
    p.ptr("double*", "part", "kc_part");
    p.ptr("const float*", "in", "input");
    p.i64("n", n_expr);
    p.i64("chunk", chunk);
    src += kernel("kc_cpu_layer_norm_part", p, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    kc_moments(in + r * n + j0, j1 - j0, &part[2 * b], &part[2 * b + 1]);
  }
)K");
    Args q;
    q.restrict_ptrs = simd;
    common(q);
    q.ptr("const double*", "part", "kc_part");
    q.i64("n", n_expr);
    q.i64("chunk", chunk);
    q.f64("eps", "eps");
    src += kernel("kc_cpu_layer_norm_apply", q, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, c = b % nc, j0 = c * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double cnt = 0, mean = 0, m2 = 0;
    for (int64_t i = 0; i < nc; ++i) {   /* Chan et al., in chunk order */
      const double nb = (double)((i + 1) * chunk < n ? chunk : n - i * chunk);
      const double mb = part[2 * (r * nc + i)], qb = part[2 * (r * nc + i) + 1];
      const double tot = cnt + nb, d = mb - mean;
      mean += d * (nb / tot);
      m2 += qb + d * d * (cnt * nb / tot);
      cnt = tot;
    }
    const double rstd = 1.0 / sqrt(m2 / (double)n + eps);
    if (c == 0) {
      mean_out[r] = (float)mean;
      rstd_out[r] = (float)rstd;
    }
    kc_normalize(in + r * n, out + r * n, w, bb, j0, j1, (float)mean, (float)rstd);
  }
)K");

    json launches = json::array(), scratch;
    if (split == 0) {
      const int64_t per = k->at("rows");
      launches.push_back(launch("kc_cpu_layer_norm_rows", "ceil_div(numel(out1), " + str(per) + ")", per, a.spec));
    } else {
      const std::string chunks = "numel(out1) * ceil_div(" + n_expr + ", " + str(split) + ")";
      launches.push_back(launch("kc_cpu_layer_norm_part", chunks, split, p.spec));
      launches.push_back(launch("kc_cpu_layer_norm_apply", chunks, split, q.spec));
      scratch = json::array({{{"name", "kc_part"}, {"bytes", chunks + " * 16"}}});
    }
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  bool handles(const OpCall& c, Rows& r) const {
    if (c.op != OpId::kLayerNorm || !dense_f32(c) || c.outputs.size() != 3) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || !ln_rows(c, *x, r)) return false;
    for (const char* wb : {"weight", "bias"})
      if (const TensorMeta* t = defined_input(c, wb); t && t->numel() != r.n) return false;
    if (!c.outputs[0].defined || c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (!c.outputs[i].defined || c.outputs[i].numel() != r.rows) return false;
    return c.scalar("eps") != nullptr;
  }
};

// ---------------------------------------------------------------------------------------------
// Layer norm backward.

class LayerNormBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.layer_norm_backward"; }
  const char* backend() const override { return "cpu"; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    Rows r;
    if (!handles(c, r)) return {};
    std::vector<KnobDim> s;
    if (c.outputs[0].defined) {
      s.push_back({"rows", rows_values(r.rows, r.n)});
      s.push_back({"split", split_values(r.rows, r.n)});
    }
    if (c.outputs[1].defined || c.outputs[2].defined) {
      // Row slabs for partial column sums: at least two slabs and at most 64 MiB of partials.
      std::vector<int64_t> wb = {0};
      for (int64_t rs : {16, 64, 256}) {
        const int64_t slabs = (r.rows + rs - 1) / rs;
        if (slabs >= 2 && slabs * r.n * 16 <= (int64_t{64} << 20)) wb.push_back(rs);
      }
      // Column blocks keep threads busy when rows are long; short rows with many of them want slabs.
      int64_t dflt = 0;
      if (r.n < 4096 && r.rows >= 256 && std::find(wb.begin(), wb.end(), 64) != wb.end()) dflt = 64;
      s.push_back({"wb_rows", default_first(wb, dflt)});
      s.push_back({"wb_cols", {256, 64, 1024}});
    }
    s.push_back({"acc", kOnOff});
    s.push_back({"unroll", kUnroll});
    s.push_back({"simd", kOnOff});
    return s;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool acc_double = k->at("acc") != 0, simd = k->at("simd") != 0;
    const bool has_w = defined_input(c, "weight") != nullptr;
    const bool dx = c.outputs[0].defined, dw = c.outputs[1].defined, db = c.outputs[2].defined;
    const std::string n_expr = "numel(input) / numel(mean)";

    std::string src = head(name(), std::string("native_layer_norm_backward weight=") + (has_w ? "yes" : "no") +
                                        " grads=" + (dx ? "x" : "") + (dw ? "w" : "") + (db ? "b" : ""),
                           k.value());
    src += accumulators(acc_double);
    json launches = json::array(), scratch = json::array();

    if (dx) {
      const std::string wg = has_w ? "(kc_acc_t)g[j] * (kc_acc_t)w[j]" : "(kc_acc_t)g[j]";
      const std::string wgf = has_w ? "g[j] * w[j]" : "g[j]";
      // Row sums a = sum(w g), b = sum(w g xhat) over [j0, j1).
      src += replace_all(R"K(static inline void kc_dx_sums(const float* KC_RS g, const float* KC_RS x, const float* KC_RS w,
                              int64_t j0, int64_t j1, float mf, float rf, double* a, double* b) {
  (void)w;
  kc_sum sa[KC_U] = {}, sb[KC_U] = {};
  int64_t j = j0;
  for (; j + KC_U <= j1; j += KC_U)
    for (int u = 0; u < KC_U; ++u) {
      const int64_t jj = j + u;
      const kc_acc_t wg = @WG@;
      const kc_acc_t xh = ((kc_acc_t)x[jj] - (kc_acc_t)mf) * (kc_acc_t)rf;
      sa[u].add(wg);
      sb[u].add(wg * xh);
    }
  for (; j < j1; ++j) {
    const int64_t jj = j;
    const kc_acc_t wg = @WG@;
    const kc_acc_t xh = ((kc_acc_t)x[jj] - (kc_acc_t)mf) * (kc_acc_t)rf;
    sa[0].add(wg);
    sb[0].add(wg * xh);
  }
  *a = kc_total(sa);
  *b = kc_total(sb);
}
)K",
                         "@WG@", replace_all(wg, "[j]", "[jj]"));
      src += "static inline void kc_dx_apply(const float* KC_RS g, const float* KC_RS x, const float* KC_RS w,\n"
             "                               float* KC_RS o, int64_t j0, int64_t j1, float mf, float rf, float ma,\n"
             "                               float mb) {\n"
             "  (void)w;\n" +
             ivdep(simd) +
             "  for (int64_t j = j0; j < j1; ++j) {\n"
             "    const float xh = (x[j] - mf) * rf;\n"
             "    o[j] = rf * ((" + wgf + ") - ma - xh * mb);\n"
             "  }\n"
             "}\n";
      auto common = [&](Args& x) {
        x.restrict_ptrs = simd;
        x.ptr("float*", "dx", "out0");
        x.ptr("const float*", "go", "grad_out");
        x.ptr("const float*", "in", "input");
        x.ptr("const float*", "mean", "mean");
        x.ptr("const float*", "rstd", "rstd");
        if (has_w) x.ptr("const float*", "w", "weight");
        else x.nullptr_decl("const float*", "w");
      };
      Args a;
      common(a);
      a.i64("rows", "numel(mean)");
      a.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_dx_rows", a, R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* g = go + r * n;
      const float* x = in + r * n;
      double sa, sb;
      kc_dx_sums(g, x, w, 0, n, mean[r], rstd[r], &sa, &sb);
      kc_dx_apply(g, x, w, dx + r * n, 0, n, mean[r], rstd[r], (float)(sa / (double)n), (float)(sb / (double)n));
    }
  }
)K");
      const int64_t split = k->at("split");
      Args p;
      p.restrict_ptrs = simd;
      p.ptr("double*", "part", "kc_dx_part");
      p.ptr("const float*", "go", "grad_out");
      p.ptr("const float*", "in", "input");
      p.ptr("const float*", "mean", "mean");
      p.ptr("const float*", "rstd", "rstd");
      if (has_w) p.ptr("const float*", "w", "weight");
      else p.nullptr_decl("const float*", "w");
      p.i64("n", n_expr);
      p.i64("chunk", str(std::max<int64_t>(split, 1)));
      src += kernel("kc_cpu_lnb_dx_part", p, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    kc_dx_sums(go + r * n, in + r * n, w, j0, j1, mean[r], rstd[r], &part[2 * b], &part[2 * b + 1]);
  }
)K");
      Args q;
      common(q);
      q.ptr("const double*", "part", "kc_dx_part");
      q.i64("n", n_expr);
      q.i64("chunk", str(std::max<int64_t>(split, 1)));
      src += kernel("kc_cpu_lnb_dx_apply", q, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    double sa = 0, sb = 0;
    for (int64_t i = 0; i < nc; ++i) {
      sa += part[2 * (r * nc + i)];
      sb += part[2 * (r * nc + i) + 1];
    }
    kc_dx_apply(go + r * n, in + r * n, w, dx + r * n, j0, j1, mean[r], rstd[r], (float)(sa / (double)n),
                (float)(sb / (double)n));
  }
)K");
      if (split == 0) {
        const int64_t per = k->at("rows");
        launches.push_back(launch("kc_cpu_lnb_dx_rows", "ceil_div(numel(mean), " + str(per) + ")", per, a.spec));
      } else {
        const std::string chunks = "numel(mean) * ceil_div(" + n_expr + ", " + str(split) + ")";
        launches.push_back(launch("kc_cpu_lnb_dx_part", chunks, split, p.spec));
        launches.push_back(launch("kc_cpu_lnb_dx_apply", chunks, split, q.spec));
        scratch.push_back({{"name", "kc_dx_part"}, {"bytes", chunks + " * 16"}});
      }
    }

    if (dw || db) {
      src += "#define KC_DW " + str(dw ? 1 : 0) + "\n#define KC_DB " + str(db ? 1 : 0) + "\n#define KC_WB_MAX 1024\n";
      auto outs = [&](Args& x) {
        if (dw) x.ptr("float*", "dw", "out1");
        else x.nullptr_decl("float*", "dw");
        if (db) x.ptr("float*", "db", "out2");
        else x.nullptr_decl("float*", "db");
      };
      auto ins = [&](Args& x) {
        x.ptr("const float*", "go", "grad_out");
        x.ptr("const float*", "in", "input");
        x.ptr("const float*", "mean", "mean");
        x.ptr("const float*", "rstd", "rstd");
      };
      // Column-blocked: a block owns columns [j0, j1) and walks every row in order.
      Args a;
      a.restrict_ptrs = simd;
      outs(a);
      ins(a);
      a.i64("rows", "numel(mean)");
      a.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_wb_cols", a, R"K(  (void)dw;
  (void)db;
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t b0 = b * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t j0 = b0; j0 < b1; j0 += KC_WB_MAX) {
      const int64_t j1 = j0 + KC_WB_MAX < b1 ? j0 + KC_WB_MAX : b1;
      kc_sum sw[KC_WB_MAX], sb[KC_WB_MAX];
      for (int64_t j = 0; j < j1 - j0; ++j) sw[j] = sb[j] = kc_sum{};
      for (int64_t r = 0; r < rows; ++r) {
        const float* KC_RS g = go + r * n;
        const float* KC_RS x = in + r * n;
        const kc_acc_t mf = mean[r], rf = rstd[r];
        (void)x;
        (void)mf;
        (void)rf;
        for (int64_t j = j0; j < j1; ++j) {
#if KC_DW
          sw[j - j0].add((kc_acc_t)g[j] * (((kc_acc_t)x[j] - mf) * rf));
#endif
#if KC_DB
          sb[j - j0].add(g[j]);
#endif
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
#if KC_DW
        dw[j] = (float)sw[j - j0].get();
#endif
#if KC_DB
        db[j] = (float)sb[j - j0].get();
#endif
      }
    }
  }
)K");
      // Row slabs: slab s sums its rows into part[s][0..n) (weight) and part[s][n..2n) (bias), in
      // double; the finishing launch adds the slabs in order.
      Args p;
      p.restrict_ptrs = simd;
      p.ptr("double*", "part", "kc_wb_part");
      ins(p);
      p.i64("rows", "numel(mean)");
      p.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_wb_part", p, std::string(R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    double* KC_RS pw = part + b * 2 * n;
    double* KC_RS pb = pw + n;
    for (int64_t j = 0; j < n; ++j) pw[j] = pb[j] = 0;
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t r = b * per; r < r1; ++r) {
      const float* KC_RS g = go + r * n;
      const float* KC_RS x = in + r * n;
      const double mf = mean[r], rf = rstd[r];
      (void)x;
      (void)mf;
      (void)rf;
)K") + ivdep(simd) + R"K(      for (int64_t j = 0; j < n; ++j) {
#if KC_DW
        pw[j] += (double)g[j] * (((double)x[j] - mf) * rf);
#endif
#if KC_DB
        pb[j] += (double)g[j];
#endif
      }
    }
  }
)K");
      Args f;
      f.restrict_ptrs = simd;
      outs(f);
      f.ptr("const double*", "part", "kc_wb_part");
      const int64_t wb_rows = k->at("wb_rows"), cols = k->at("wb_cols");
      const std::string slabs = "ceil_div(numel(mean), " + str(std::max<int64_t>(wb_rows, 1)) + ")";
      f.i64("slabs", slabs);
      f.i64("n", n_expr);
      src += kernel("kc_cpu_lnb_wb_finish", f, R"K(  (void)dw;
  (void)db;
  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t b0 = b * per, b1 = b0 + per < n ? b0 + per : n;
    for (int64_t j0 = b0; j0 < b1; j0 += KC_WB_MAX) {
      const int64_t j1 = j0 + KC_WB_MAX < b1 ? j0 + KC_WB_MAX : b1;
      double sw[KC_WB_MAX], sb[KC_WB_MAX];
      for (int64_t j = 0; j < j1 - j0; ++j) sw[j] = sb[j] = 0;
      for (int64_t s = 0; s < slabs; ++s) {
        const double* KC_RS pw = part + s * 2 * n;
        const double* KC_RS pb = pw + n;
        for (int64_t j = j0; j < j1; ++j) {
          sw[j - j0] += pw[j];
          sb[j - j0] += pb[j];
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
#if KC_DW
        dw[j] = (float)sw[j - j0];
#endif
#if KC_DB
        db[j] = (float)sb[j - j0];
#endif
      }
    }
  }
)K");
      const std::string col_grid = "ceil_div(" + n_expr + ", " + str(cols) + ")";
      if (wb_rows == 0) {
        launches.push_back(launch("kc_cpu_lnb_wb_cols", col_grid, cols, a.spec));
      } else {
        launches.push_back(launch("kc_cpu_lnb_wb_part", slabs, wb_rows, p.spec));
        launches.push_back(launch("kc_cpu_lnb_wb_finish", col_grid, cols, f.spec));
        scratch.push_back({{"name", "kc_wb_part"}, {"bytes", slabs + " * " + n_expr + " * 16"}});
      }
    }
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  bool handles(const OpCall& c, Rows& r) const {
    if (c.op != OpId::kLayerNormBackward || !dense_f32(c) || c.outputs.size() != 3) return false;
    const TensorMeta* x = defined_input(c, "input");
    if (!x || !ln_rows(c, *x, r)) return false;
    if (!same_sizes(x, defined_input(c, "grad_out"))) return false;
    for (const char* s : {"mean", "rstd"}) {
      const TensorMeta* t = defined_input(c, s);
      if (!t || t->numel() != r.rows) return false;
    }
    if (const TensorMeta* w = defined_input(c, "weight"); w && w->numel() != r.n) return false;
    if (c.outputs[0].defined && c.outputs[0].sizes != x->sizes) return false;
    for (int i = 1; i < 3; ++i)
      if (c.outputs[i].defined && c.outputs[i].numel() != r.n) return false;
    return c.outputs[0].defined || c.outputs[1].defined || c.outputs[2].defined;
  }
};

const UnaryTemplate kUnaryT(false);
const UnaryTemplate kUnaryBackwardT(true);
const SoftmaxTemplate kSoftmaxT(false);
const SoftmaxTemplate kSoftmaxBackwardT(true);
const LayerNormTemplate kLayerNormT;
const LayerNormBackwardTemplate kLayerNormBackwardT;

}  // namespace

const std::vector<const Template*>& cpu_templates() {
  static const std::vector<const Template*> v = {&kUnaryT,    &kUnaryBackwardT, &kSoftmaxT,
                                                 &kSoftmaxBackwardT, &kLayerNormT, &kLayerNormBackwardT};
  return v;
}

}  // namespace kc::evolve
