// CPU reduction template (cpu.reduction): sum, mean, amax, amin, argmax, argmin, var, std,
// var_mean, std_mean, linalg_vector_norm, max.dim, min.dim, prod.dim_int and logsumexp over one
// block of adjacent dims, or two blocks around the kept ones, fp32.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
//
// The input is [outer, r, inner] (reduction.h). inner == 1: a block is `rows` rows, each folded
// in order. inner > 1: a block is `cols` adjacent columns of one outer slice, walked along r with
// one state per column (the inner loop runs across columns, so sums vectorize). Two runs
// [r1, mid, r2]: a block is `rows` outputs, each folding its r1 runs of r2 contiguous inputs in
// turn. Every output is
// one fold of its inputs in index order, whatever the block partition, so results are
// deterministic. Sums, products and Welford states are double (a double product of fp32 factors
// neither overflows nor underflows where eager's fp32 one does not); max / min / argmax compare
// floats.
#include <cstdio>

#include "evolve/ops/reduction.h"
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// The fold state (S, kc_init, kc_add, kc_store) of each kind, host C++.
std::string cpu_state(const ReduceGeom& g) {
  const ReduceKind k = g.kind;
  if (indexed(k)) {
    // Strict comparison keeps the first of equal values; the first NaN wins and stays.
    const bool max = selects_max(k);
    // argmax writes its index through out0; max.dim its value to out0 and its index to out1.
    const char* store = k == ReduceKind::kArgMax || k == ReduceKind::kArgMin
                            ? "(void)o1; ((int64_t*)o0)[o] = s->i;"
                            : "o0[o] = s->v; ((int64_t*)o1)[o] = s->i;";
    return std::string("struct S { float v; int64_t i; };\n"
                       "static inline S kc_init() { S s; s.v = ") + (max ? "-INFINITY" : "INFINITY") +
           "; s.i = -1; return s; }\n"
           "static inline void kc_add(S* s, float v, int64_t j) {\n"
           "  if (s->i < 0 || (s->v == s->v && (v != v || v " + (max ? ">" : "<") + " s->v))) { s->v = v; s->i = j; }\n"
           "}\n"
           "static inline void kc_store(float* o0, float* o1, int64_t o, const S* s) { " + store + " }\n";
  }
  if (k == ReduceKind::kProd)
    return "typedef double S;\n"
           "static inline S kc_init() { return 1; }\n"
           "static inline void kc_add(S* s, float v, int64_t j) { (void)j; *s *= v; }\n"
           "static inline void kc_store(float* o0, float* o1, int64_t o, const S* s) { (void)o1; o0[o] = (float)*s; }\n";
  if (k == ReduceKind::kLogSumExp)
    // The running max m and sum s of exp(x - m), in double. Equal values add 1, so a row of
    // infinities (inf - inf is NaN) gives m + log(count); a NaN makes s NaN and stays.
    return "struct S { double m, s; };\n"
           "static inline S kc_init() { S s; s.m = -INFINITY; s.s = 0; return s; }\n"
           "static inline void kc_add(S* s, float v, int64_t j) {\n"
           "  (void)j;\n"
           "  const double x = v;\n"
           "  if (x > s->m) { s->s = s->s * exp(s->m - x) + 1; s->m = x; }\n"
           "  else s->s += x == s->m ? 1.0 : exp(x - s->m);\n"
           "}\n"
           "static inline void kc_store(float* o0, float* o1, int64_t o, const S* s) { (void)o1; o0[o] = (float)(s->m + log(s->s)); }\n";
  if (welford(k)) {
    const bool sd = k == ReduceKind::kStd || k == ReduceKind::kStdMean;
    const bool two = k == ReduceKind::kVarMean || k == ReduceKind::kStdMean;
    char corr[64];
    std::snprintf(corr, sizeof corr, "%.17g", g.correction);
    return std::string("struct S { double n, m, q; };   /* Welford */\n"
                       "static inline S kc_init() { S s; s.n = 0; s.m = 0; s.q = 0; return s; }\n"
                       "static inline void kc_add(S* s, float v, int64_t j) {\n"
                       "  (void)j;\n"
                       "  s->n += 1;\n"
                       "  const double d = v - s->m;\n"
                       "  s->m += d / s->n;\n"
                       "  s->q += d * (v - s->m);\n"
                       "}\n"
                       "static inline void kc_store(float* o0, float* o1, int64_t o, const S* s) {\n"
                       "  (void)o1;\n"
                       "  const double div = s->n - ") + corr + " > 0 ? s->n - " + corr + " : 0;\n"
           "  const double var = s->q / div;\n"
           "  o0[o] = (float)" + (sd ? "sqrt(var)" : "var") + ";\n" + (two ? "  o1[o] = (float)(s->m + 0.0 * s->q);   /* NaN once inf or NaN was folded */\n" : "") + "}\n";
  }
  const bool pick = k == ReduceKind::kMax || k == ReduceKind::kMin || (k == ReduceKind::kNorm && g.ord != NormOrd::kP);
  if (pick) {
    const bool max = k == ReduceKind::kMax || (k == ReduceKind::kNorm && g.ord == NormOrd::kInf);
    const std::string w = k == ReduceKind::kNorm ? "fabsf(v)" : "v";
    return std::string("typedef float S;\n"
                       "static inline S kc_init() { return ") + (max ? "-INFINITY" : "INFINITY") + "; }\n"
           "static inline void kc_add(S* s, float v, int64_t j) { (void)j; const float w = " + w + "; if (w " +
           (max ? ">" : "<") + " *s || w != w) *s = w; }\n"
           "static inline void kc_store(float* o0, float* o1, int64_t o, const S* s) { (void)o1; o0[o] = *s; }\n";
  }
  std::string term = "(double)v", fin = "*s";
  if (k == ReduceKind::kMean) fin = "*s / " + str(g.r) + ".0";
  if (k == ReduceKind::kNorm) {
    char p[64];
    std::snprintf(p, sizeof p, "%.17g", g.p);
    if (g.p == 1) term = "fabs((double)v)";
    else if (g.p == 2) term = "(double)v * v", fin = "sqrt(*s)";
    else term = std::string("pow(fabs((double)v), ") + p + ")", fin = std::string("pow(*s, 1.0 / ") + p + ")";
  }
  return "typedef double S;\n"
         "static inline S kc_init() { return 0; }\n"
         "static inline void kc_add(S* s, float v, int64_t j) { (void)j; *s += " + term + "; }\n"
         "static inline void kc_store(float* o0, float* o1, int64_t o, const S* s) { (void)o1; o0[o] = (float)(" + fin + "); }\n";
}

const char* kRowsBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    for (int64_t row = b * per; row < r1; ++row) {
      const float* KC_RS x = in + row * n;
      S s = kc_init();
      for (int64_t j = 0; j < n; ++j) kc_add(&s, x[j], j);
      kc_store(out0, out1, row, &s);
    }
  }
)K";

const char* kColsBody = R"K(  const int64_t per = ctx->block[0];
  const int64_t tiles = (inner + per - 1) / per;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t o = b / tiles, c0 = (b % tiles) * per;
    const int64_t w = inner - c0 < per ? inner - c0 : per;
    S a[KC_COLS];
    for (int64_t j = 0; j < w; ++j) a[j] = kc_init();
    const float* KC_RS x = in + o * n * inner + c0;
    for (int64_t l = 0; l < n; ++l) {
@IVDEP@      for (int64_t j = 0; j < w; ++j) kc_add(&a[j], x[l * inner + j], l);
    }
    for (int64_t j = 0; j < w; ++j) kc_store(out0, out1, o * inner + c0 + j, &a[j]);
  }
)K";

const char* kTwoRunsBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t m1 = (b + 1) * per < mid ? (b + 1) * per : mid;
    for (int64_t m = b * per; m < m1; ++m) {
      S s = kc_init();
      for (int64_t j1 = 0; j1 < r1; ++j1) {
        const float* KC_RS x = in + (j1 * mid + m) * r2;
        for (int64_t j = 0; j < r2; ++j) kc_add(&s, x[j], j1 * r2 + j);
      }
      kc_store(out0, out1, m, &s);
    }
  }
)K";

constexpr int64_t kMaxCols = 256;
const std::vector<int64_t> kCols = {16, 32, 64, 128, 256};

class ReductionTemplate : public Template {
 public:
  const char* name() const override { return "cpu.reduction"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    ReduceGeom g;
    if (!handles(c, g)) return {};
    if (!g.block) return {{"rows", rows_values(g.mid, g.r)}};
    if (g.inner == 1) return {{"rows", rows_values(g.outer, g.r)}};
    auto cols = useful_sizes(kCols, g.inner);
    return {{"cols", default_first(cols, pick_default(cols, 64))}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    ReduceGeom g;
    handles(c, g);
    const bool rows_path = g.block && g.inner == 1;
    const bool simd = g.block && !rows_path && k->at("simd") != 0;
    const std::string opname = op_info(c.op).name;
    const std::string entry = "kc_cpu_" + opname;
    Args a;
    a.restrict_ptrs = simd;
    // Argmax writes int64 through out0, max.dim through out1 (kc_store casts); out1 only for
    // var_mean / std_mean and max / min.dim.
    a.ptr("float*", "out0", "out0");
    if (c.outputs.size() == 2) a.ptr("float*", "out1", "out1");
    else a.nullptr_decl("float*", "out1");
    a.ptr("const float*", "in", "self");
    std::string body;
    json l;
    if (!g.block) {
      a.i64("mid", str(g.mid));
      a.i64("r1", str(g.r1));
      a.i64("r2", str(g.r2));
      body = kTwoRunsBody;
      const int64_t per = k->at("rows");
      l = json::array({launch(entry, str(cdiv(g.mid, per)), per, a.spec)});
    } else if (rows_path) {
      a.i64("rows", str(g.outer));
      a.i64("n", str(g.r));
      body = kRowsBody;
      const int64_t per = k->at("rows");
      l = json::array({launch(entry, str(cdiv(g.outer, per)), per, a.spec)});
    } else {
      a.i64("n", str(g.r));
      a.i64("inner", str(g.inner));
      body = replace_all(kColsBody, "@IVDEP@", ivdep(simd));
      const int64_t per = k->at("cols");
      l = json::array({launch(entry, str(g.outer * cdiv(g.inner, per)), per, a.spec)});
    }
    std::string src = head(name(), opname + (!g.block ? " two runs" : rows_path ? " rows" : " cols"), k.value()) + "#define KC_COLS " +
                      str(kMaxCols) + "\n" + cpu_state(g) + kernel(entry, a, body);
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
  // fp32 in (and out; int64 for argmax and max / min.dim's indices), dense, the reduced dims one
  // block or two around the kept ones.
  static bool handles(const OpCall& c, ReduceGeom& g) {
    if (c.backend != BackendKind::kCpu || op_info(c.op).family != OpFamily::kReduction || !c.dense() || c.outputs.empty())
      return false;
    const TensorMeta* x = defined_input(c, "self");
    if (!x || x->dtype != DType::kF32 || x->numel() <= 0) return false;
    const bool arg = c.op == OpId::kArgmax || c.op == OpId::kArgmin;
    const bool pair = c.op == OpId::kMax || c.op == OpId::kMin;
    for (size_t j = 0; j < c.outputs.size(); ++j)
      if (!c.outputs[j].defined || c.outputs[j].dtype != (arg || (pair && j == 1) ? DType::kI64 : DType::kF32)) return false;
    auto r = reduce_geometry(c);
    if (!r.is_ok()) return false;
    const bool block = r->block && r->outer * r->r * r->inner == x->numel();
    if (!block && !(r->two_runs && !indexed(r->kind) && r->r1 * r->mid * r->r2 == x->numel())) return false;
    g = r.value();
    g.block = block;
    return true;
  }
};

}  // namespace

const Template* cpu_reduction_template() {
  static const ReductionTemplate t;
  return &t;
}

}  // namespace kc::evolve
