// CPU scan template (cpu.scan): cumsum, cumprod and logcumsumexp along one axis, fp32.
// Part of the CPU op-family templates (overview in templates_cpu.cpp); shared pieces in
// templates_cpu_common.h.
//
// The input is viewed as [outer, L, inner] (L = size(dim), inner = stride(out0, dim): outputs are
// dense with canonical strides). inner == 1: a block is `rows` rows, scanned KC_U rows at a time
// so independent carries overlap their latencies. inner > 1: a block is `cols` adjacent columns
// of one outer slice, walked along L with one carry per column (the inner loop runs across
// columns, so it vectorizes). Every element is one fixed fold of its prefix in order, whatever the
// block partition, so results are bitwise deterministic. Carries are double (acc=1) or float.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

// kc_comb in the accumulator type with its identity KC_ID (kc_comb(KC_ID, x) == x exactly).
// log-add-exp as eager: NaN wins, equal infinities stay, else max + log1p(exp(min - max)).
std::string comb_fn(OpId op, bool dbl) {
  const std::string t = dbl ? "double" : "float";
  std::string s = "typedef " + t + " kc_acc_t;\n";
  if (op == OpId::kCumsum) return s + "#define KC_ID (-0.0)\nstatic inline kc_acc_t kc_comb(kc_acc_t a, kc_acc_t b) { return a + b; }\n";
  if (op == OpId::kCumprod) return s + "#define KC_ID 1.0\nstatic inline kc_acc_t kc_comb(kc_acc_t a, kc_acc_t b) { return a * b; }\n";
  const std::string f = dbl ? "" : "f";
  return s + "#define KC_ID (-INFINITY)\n"
             "static inline kc_acc_t kc_comb(kc_acc_t a, kc_acc_t b) {\n"
             "  if (a != a || b != b) return a + b;\n"
             "  const kc_acc_t mx = a > b ? a : b, mn = a > b ? b : a;\n"
             "  if (mn == mx && (mx == INFINITY || mx == -INFINITY)) return mx;\n"
             "  return mx + log1p" + f + "(exp" + f + "(mn - mx));\n"
             "}\n";
}

// Rows: block b covers rows [b * per, ...); KC_U rows advance together, the rest one by one.
const char* kRowsBody = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t r1 = (b + 1) * per < rows ? (b + 1) * per : rows;
    int64_t r = b * per;
    for (; r + KC_U <= r1; r += KC_U) {
      kc_acc_t a[KC_U];
      for (int u = 0; u < KC_U; ++u) a[u] = KC_ID;
      for (int64_t j = 0; j < n; ++j)
        for (int u = 0; u < KC_U; ++u) {
          a[u] = kc_comb(a[u], (kc_acc_t)in[(r + u) * n + j]);
          out[(r + u) * n + j] = (float)a[u];
        }
    }
    for (; r < r1; ++r) {
      kc_acc_t a = KC_ID;
      for (int64_t j = 0; j < n; ++j) {
        a = kc_comb(a, (kc_acc_t)in[r * n + j]);
        out[r * n + j] = (float)a;
      }
    }
  }
)K";

// Cols: block b is column tile b % tiles of outer slice b / tiles; up to KC_COLS carries.
const char* kColsBody = R"K(  const int64_t per = ctx->block[0];
  const int64_t tiles = (inner + per - 1) / per;
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    const int64_t o = b / tiles, c0 = (b % tiles) * per;
    const int64_t w = inner - c0 < per ? inner - c0 : per;
    kc_acc_t a[KC_COLS];
    for (int64_t j = 0; j < w; ++j) a[j] = KC_ID;
    const float* KC_RS x = in + o * n * inner + c0;
    float* KC_RS y = out + o * n * inner + c0;
    for (int64_t l = 0; l < n; ++l) {
@IVDEP@      for (int64_t j = 0; j < w; ++j) {
        a[j] = kc_comb(a[j], (kc_acc_t)x[l * inner + j]);
        y[l * inner + j] = (float)a[j];
      }
    }
  }
)K";

constexpr int64_t kMaxCols = 256;
const std::vector<int64_t> kCols = {16, 32, 64, 128, 256};

struct ScanGeom {
  int64_t outer = 0, n = 0, inner = 0;
};

class ScanTemplate : public Template {
 public:
  const char* name() const override { return "cpu.scan"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    ScanGeom g;
    if (!handles(c, g)) return {};
    if (g.inner == 1) return {{"rows", rows_values(g.outer, g.n)}, {"unroll", kUnroll}, {"acc", kOnOff}};
    auto cols = useful_sizes(kCols, g.inner);
    return {{"cols", default_first(cols, pick_default(cols, 64))}, {"acc", kOnOff}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    ScanGeom g;
    handles(c, g);
    const bool rows_path = g.inner == 1;
    const bool simd = !rows_path && k->at("simd") != 0;
    const std::string opname = op_info(c.op).name;
    const std::string entry = "kc_cpu_" + opname;
    const std::string L = "size(self, dim)", inner = "stride(out0, dim)";
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("float*", "out", "out0");
    a.ptr("const float*", "in", "self");
    std::string body;
    json l;
    if (rows_path) {
      a.i64("rows", "numel(self) / " + L);
      a.i64("n", L);
      body = kRowsBody;
      const int64_t per = k->at("rows");
      l = json::array({launch(entry, "ceil_div(numel(self) / " + L + ", " + str(per) + ")", per, a.spec)});
    } else {
      a.i64("n", L);
      a.i64("inner", inner);
      body = replace_all(kColsBody, "@IVDEP@", ivdep(simd));
      const int64_t per = k->at("cols");
      const std::string blocks = "numel(self) / (" + L + " * " + inner + ") * ceil_div(" + inner + ", " + str(per) + ")";
      l = json::array({launch(entry, blocks, per, a.spec)});
    }
    std::string src = head(name(), opname + (rows_path ? " rows" : " cols"), k.value()) +
                      "#define KC_COLS " + str(kMaxCols) + "\n" + comb_fn(c.op, k->at("acc") != 0) + kernel(entry, a, body);
    return candidate(name(), k.value(), std::move(src), std::move(l));
  }

 private:
  // fp32 in and out, output dtype "none" or "f32", a real dim; inner read back from out0's strides.
  static bool handles(const OpCall& c, ScanGeom& g) {
    if (!dense_f32(c) || op_info(c.op).family != OpFamily::kScan || c.outputs.size() != 1) return false;
    const TensorMeta* x = defined_input(c, "self");
    if (!x || x->sizes.empty() || x->numel() <= 0) return false;
    const std::string want = c.string_arg("dtype", "none");
    if (want != "none" && want != "f32") return false;
    const TensorMeta& o = c.outputs[0];
    if (!o.defined || o.sizes != x->sizes || o.strides.size() != x->sizes.size()) return false;
    const int64_t nd = static_cast<int64_t>(x->sizes.size());
    int64_t d = c.int_arg("dim", -1);
    if (d < 0) d += nd;
    if (d < 0 || d >= nd) return false;
    g.n = x->sizes[d];
    g.inner = 1;
    for (int64_t i = d + 1; i < nd; ++i) g.inner *= x->sizes[i];
    if (o.strides[d] != g.inner) return false;
    g.outer = x->numel() / (g.n * g.inner);
    return true;
  }
};

}  // namespace

const Template* cpu_scan_template() {
  static const ScanTemplate t;
  return &t;
}

}  // namespace kc::evolve
