// Shared pieces of the CPU op-family templates (templates_cpu_*.cpp): knob plumbing, argument
// lists, kernel heads, accumulators and the exp used by the exp-based ops. Internal to evolve/.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "evolve/propose/proposer.h"

namespace kc::evolve::cpu_tpl {


using nlohmann::json;

inline Status unsupported(const std::string& m) { return Status::error(Code::kUnsupported, m); }

inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

inline std::string str(int64_t v) { return std::to_string(v); }

// fp32 everywhere, contiguous and aligned, on the CPU backend.
inline bool dense_f32(const OpCall& c) {
  if (c.backend != BackendKind::kCpu || !c.dense()) return false;
  for (const auto& t : c.inputs)
    if (t.defined && t.dtype != DType::kF32) return false;
  for (const auto& t : c.outputs)
    if (t.defined && t.dtype != DType::kF32) return false;
  return !c.outputs.empty();
}

inline const TensorMeta* defined_input(const OpCall& c, const std::string& name) {
  const TensorMeta* t = c.input(name);
  return t && t->defined ? t : nullptr;
}

inline bool same_sizes(const TensorMeta* a, const TensorMeta* b) { return a && b && a->sizes == b->sizes; }

// `order` with `dflt` moved to the front (the template's default is the first value).
inline std::vector<int64_t> default_first(std::vector<int64_t> order, int64_t dflt) {
  auto it = std::find(order.begin(), order.end(), dflt);
  if (it != order.end()) order.erase(it);
  order.insert(order.begin(), dflt);
  return order;
}

// Work sizes (ascending `all`) worth trying for `total` items: every value below it and the
// smallest one covering it (larger ones would all make the same single block).
inline std::vector<int64_t> useful_sizes(const std::vector<int64_t>& all, int64_t total) {
  std::vector<int64_t> v;
  for (int64_t x : all) {
    v.push_back(x);
    if (x >= total) break;
  }
  return v;
}

// The largest useful value not above `target` (or the smallest useful value).
inline int64_t pick_default(const std::vector<int64_t>& useful, int64_t target) {
  int64_t d = useful.front();
  for (int64_t x : useful)
    if (x <= target) d = x;
  return d;
}

inline const std::vector<int64_t> kElems = {1024, 2048, 4096, 8192, 16384, 32768, 65536};
inline const std::vector<int64_t> kRows = {1, 2, 4, 8, 16, 32, 64};
inline const std::vector<int64_t> kSplit = {16384, 65536, 262144, 1048576};
inline const std::vector<int64_t> kUnroll = {4, 1, 2, 8};
inline const std::vector<int64_t> kOnOff = {1, 0};

inline std::vector<int64_t> elems_values(int64_t n) {
  auto u = useful_sizes(kElems, n);
  return default_first(u, pick_default(u, 16384));
}

// Rows per block: about 16K elements per block by default.
inline std::vector<int64_t> rows_values(int64_t rows, int64_t n) {
  auto u = useful_sizes(kRows, rows);
  return default_first(u, pick_default(u, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1))));
}

// Row splitting for long rows: 0 (off) or a chunk length that cuts the row at least in two. On by
// default only when there are too few rows to keep threads busy and the rows are long.
inline std::vector<int64_t> split_values(int64_t rows, int64_t n) {
  std::vector<int64_t> v = {0};
  for (int64_t s : kSplit)
    if (n >= 2 * s) v.push_back(s);
  int64_t dflt = (rows < 32 && n >= 2 * 65536) ? 65536 : 0;
  return default_first(v, dflt);
}

// Checks `k` against `space`: unknown knobs and values outside the space are kUnsupported; missing
// knobs take their default. The result names every knob of the space.
inline Result<Knobs> settle(const std::vector<KnobDim>& space, const Knobs& k) {
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

inline json launch(const std::string& entry, const std::string& grid, int64_t block, const json& args) {
  return {{"entry", entry}, {"grid", {grid, 1, 1}}, {"block", {block, 1, 1}}, {"smem", 0}, {"args", args}};
}

// "extern C" kernel text: `body` with @ENTRY@, @ARGS@ (declarations) substituted.
inline std::string kernel(const std::string& entry, const Args& a, const std::string& body) {
  return "extern \"C\" void " + entry + "(const kc_cpu_ctx* ctx, void* const* args) {\n" + a.decl + body + "}\n";
}

// The first kernel of a split-row normalization (layer and group norm): block b writes the
// moments (kc_moments: mean and sum of squared deviations) of its chunk of row b / chunks into
// part[2 b], part[2 b + 1]. p receives its arguments (for its launch).
inline std::string moments_part_kernel(const std::string& entry, const std::string& n_expr, const std::string& chunk,
                                       bool simd, Args& p) {
  p.restrict_ptrs = simd;
  p.ptr("double*", "part", "kc_part");
  p.ptr("const float*", "in", "input");
  p.i64("n", n_expr);
  p.i64("chunk", chunk);
  return kernel(entry, p, R"K(  const int64_t nc = (n + chunk - 1) / chunk;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r = b / nc, j0 = (b % nc) * chunk;
    const int64_t j1 = j0 + chunk < n ? j0 + chunk : n;
    kc_moments(in + r * n + j0, j1 - j0, &part[2 * b], &part[2 * b + 1]);
  }
)K");
}

inline std::string ivdep(bool simd) { return simd ? "#pragma GCC ivdep\n" : ""; }

// kc_exp(x): libm expf (vexp=0), or an inline exp the compiler can vectorize (vexp=1): Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2/2, a degree-7 Taylor polynomial for e^r (truncation 5e-9
// relative), and 2^n applied in two exact power-of-two steps so overflow gives inf and tiny results
// round once into the denormal range. NaN propagates, -inf gives 0, +inf gives inf; about 1-2 ulp.
inline std::string exp_fn(bool vexp) {
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
inline bool exp_op(OpId op) {
  return op == OpId::kSilu || op == OpId::kSigmoid || op == OpId::kSiluBackward || op == OpId::kSoftmax ||
         op == OpId::kLogSoftmax || op == OpId::kLogSoftmaxBackward;
}

// Knobs that shape the code; the others only change the launch spec, so they stay out of the
// source text (one compiled source serves every work split).
inline bool shapes_code(const std::string& knob) {
  return knob == "unroll" || knob == "simd" || knob == "acc" || knob == "stats" || knob == "vexp";
}

// Common head of every source: provenance comment, unroll factor, restrict spelling.
inline std::string head(const char* family, const std::string& what, const Knobs& k) {
  std::string s = "// kernelcraft " + std::string(family) + ": " + what + ";";
  for (const auto& [n, v] : k)
    if (shapes_code(n)) s += " " + n + "=" + str(v);
  s += "\n#define KC_U " + str(k.count("unroll") ? k.at("unroll") : 1) + "\n";
  s += std::string("#define KC_RS ") + (k.count("simd") && k.at("simd") ? "__restrict" : "") + "\n";
  return s;
}

// Accumulators for reductions: double, or float with Kahan compensation (a few ulp for any n).
// kc_acc_t is the type products are formed in before they are added.
inline std::string accumulators(bool dbl) {
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

// kc_f (load as float) and kc_put (store, rounded once) for float and bf16 (uint16_t) elements:
// bf16 is the upper half of a float; stores round to nearest even and keep NaN quiet.
inline std::string bf16_conversions() {
  return R"K(static inline float kc_f(float v) { return v; }
static inline float kc_f(uint16_t v) {
  const uint32_t u = (uint32_t)v << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
static inline void kc_put(float* p, float v) { *p = v; }
static inline void kc_put(uint16_t* p, float v) {
  uint32_t u;
  __builtin_memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) { *p = (uint16_t)((u >> 16) | 0x40u); return; }
  u += 0x7fffu + ((u >> 16) & 1u);
  *p = (uint16_t)(u >> 16);
}
)K";
}

// The C element type of a CPU template's f32 or bf16 tensor.
inline const char* elem_type(DType d) { return d == DType::kF32 ? "float" : "uint16_t"; }

inline Candidate candidate(const char* family, Knobs k, std::string source, json launches, json scratch = json()) {
  Candidate c;
  c.family = family;
  c.knobs = std::move(k);
  c.source = std::move(source);
  c.launch = {{"version", 1}, {"launches", std::move(launches)}};
  if (!scratch.is_null() && !scratch.empty()) c.launch["scratch"] = std::move(scratch);
  return c;
}

// Row-wise families share this: the last dim of `t` is a row of n elements, rows = numel / n.
struct Rows {
  int64_t rows = 0, n = 0;
};


// Rows and row length of a layer-norm call; false when shapes do not fit together.
inline bool ln_rows(const OpCall& c, const TensorMeta& x, Rows& r) {
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

}  // namespace kc::evolve::cpu_tpl
