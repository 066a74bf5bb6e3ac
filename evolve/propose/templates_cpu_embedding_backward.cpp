// CPU embedding backward template: cpu.embedding_backward (embedding_dense_backward, fp32
// grad_output, int64 or int32 indices). Part of the CPU op-family templates (overview in
// templates_cpu.cpp); shared pieces in templates_cpu_common.h.
//
// Launch 1 (one block) lists, per output row, the positions whose index is that row, in
// ascending order (a counting sort over the positions in order: stable, so deterministic);
// padding_idx and indices outside [0, W) reach no row. Launch 2 gives each block `rows` output
// rows: each row is zeroed, then its positions' grad rows are added in that order in fp32
// (scale_grad_by_freq: the sum divided by the row's count once). Knobs: rows, simd.
#include "evolve/propose/templates_cpu_common.h"

namespace kc::evolve {
namespace {

using namespace cpu_tpl;
using nlohmann::json;

const char* kEbwBuckets = R"K(  int64_t* KC_RS cur = off + W + 1;
  for (int64_t w = 0; w <= W; ++w) off[w] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (int64_t)idx[i];
    if (k >= 0 && k < W && k != pad) ++off[k + 1];
  }
  for (int64_t w = 0; w < W; ++w) off[w + 1] += off[w];
  for (int64_t w = 0; w < W; ++w) cur[w] = off[w];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (int64_t)idx[i];
    if (k >= 0 && k < W && k != pad) pos[cur[k]++] = i;
  }
)K";

const char* kEbwRows = R"K(  const int64_t per = ctx->block[0];
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t w = b * per; w < (b + 1) * per && w < W; ++w) {
      float* KC_RS o = out + w * D;
      for (int64_t j = 0; j < D; ++j) o[j] = 0.f;
      for (int64_t s = off[w]; s < off[w + 1]; ++s) {
        const float* KC_RS gr = g + pos[s] * D;
@IVDEP@        for (int64_t j = 0; j < D; ++j) o[j] += gr[j];
      }
      if (KC_SCALE && off[w + 1] > off[w]) {
        const float c = (float)(off[w + 1] - off[w]);
        for (int64_t j = 0; j < D; ++j) o[j] /= c;
      }
    }
)K";

struct EbwShape {
  int64_t n = 0, w = 0, d = 0;
  bool i32 = false, scale = false;
};

class EmbeddingBackwardTemplate : public Template {
 public:
  const char* name() const override { return "cpu.embedding_backward"; }
  BackendKind backend() const override { return BackendKind::kCpu; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    EbwShape s;
    if (!handles(c, s)) return {};
    return {{"rows", rows_values(s.w, s.d)}, {"simd", kOnOff}};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& knobs) const override {
    EbwShape s;
    if (!handles(c, s)) return unsupported("cpu.embedding_backward does not handle this call");
    Result<Knobs> k = settle(space(c), knobs);
    if (!k.is_ok()) return k.status();
    const bool simd = k->at("simd") != 0;
    std::string src = head(name(), std::string("embedding_dense_backward indices ") + (s.i32 ? "i32" : "i64") +
                                        (s.scale ? " scale_grad_by_freq" : ""), k.value());
    src += std::string("#define KC_SCALE ") + (s.scale ? "1" : "0") + "\n";
    const std::string W = "num_weights", n = "numel(indices)";
    Args a;
    a.restrict_ptrs = simd;
    a.ptr("int64_t*", "off", "kc_off");
    a.ptr("int64_t*", "pos", "kc_pos");
    a.ptr(s.i32 ? "const int32_t*" : "const int64_t*", "idx", "indices");
    a.i64("n", n);
    a.i64("W", W);
    a.i64("pad", "padding_idx");
    src += kernel("kc_cpu_ebw_buckets", a, std::string("  (void)ctx;\n") + kEbwBuckets);
    Args r;
    r.restrict_ptrs = simd;
    r.ptr("float*", "out", "out0");
    r.ptr("const float*", "g", "grad_output");
    r.ptr("const int64_t*", "off", "kc_off");
    r.ptr("const int64_t*", "pos", "kc_pos");
    r.i64("W", W);
    r.i64("D", "size(grad_output,-1)");
    src += kernel("kc_cpu_ebw_rows", r, replace_all(kEbwRows, "@IVDEP@", ivdep(simd)));
    const int64_t per = k->at("rows");
    json launches = json::array({launch("kc_cpu_ebw_buckets", "1", 1, a.spec),
                                 launch("kc_cpu_ebw_rows", "ceil_div(" + W + ", " + str(per) + ")", per, r.spec)});
    // off: W + 1 offsets, then W cursors; pos: one slot a position.
    json scratch = json::array({{{"name", "kc_off"}, {"bytes", "(2 * " + W + " + 1) * 8"}}, {{"name", "kc_pos"}, {"bytes", n + " * 8"}}});
    return candidate(name(), k.value(), std::move(src), std::move(launches), std::move(scratch));
  }

 private:
  // fp32 grad_output and output (dense_f32 would refuse the integer indices), n >= 1, W >= 1.
  bool handles(const OpCall& c, EbwShape& s) const {
    if (c.backend != BackendKind::kCpu || c.op != OpId::kEmbeddingBackward || !c.dense() || c.outputs.size() != 1) return false;
    const TensorMeta *g = defined_input(c, "grad_output"), *ix = defined_input(c, "indices");
    if (!g || !ix || g->dtype != DType::kF32 || g->sizes.empty() || (ix->dtype != DType::kI64 && ix->dtype != DType::kI32)) return false;
    s.i32 = ix->dtype == DType::kI32;
    s.n = ix->numel(), s.d = g->sizes.back(), s.w = c.int_arg("num_weights", 0);
    s.scale = c.int_arg("scale_grad_by_freq", 0) != 0;
    if (s.n <= 0 || s.d <= 0 || s.w <= 0 || g->numel() != s.n * s.d) return false;
    const TensorMeta& o = c.outputs[0];
    return o.defined && o.dtype == DType::kF32 && o.sizes == std::vector<int64_t>{s.w, s.d};
  }
};

}  // namespace

const Template* cpu_embedding_backward_template() {
  static const EmbeddingBackwardTemplate t;
  return &t;
}

}  // namespace kc::evolve
