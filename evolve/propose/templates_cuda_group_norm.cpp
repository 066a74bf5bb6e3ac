// CUDA group norm template (cuda.group_norm): native_group_norm forward.
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h.
//
// Rows are (n, g): M = N * group rows of L = C / group * HxW contiguous elements, each row made of
// C / group channel planes of HxW elements. Two strategies (knob "split"):
//   split = 0: a group of threads (a warp, or the whole block) per row, as in cuda.layer_norm:
//     statistics from registers (regs = 1, corrected two-pass) or streamed (Welford), then the
//     row is normalised in the same launch.
//   split = S > 0, for few long rows: launch 1 cuts every row into S chunks and writes each
//     chunk's (mean, M2) into scratch; launch 2 is a pass over channel planes: every block owns a
//     piece of one (n, c) plane, combines its row's S partials (Chan, fixed order, so all blocks
//     of a row agree bit for bit), and applies y = x * a + b' with a = rstd * w[c] and
//     b' = b[c] - mean * a computed once for the block. The first block of each row writes its
//     mean and rstd.
//   fuse = CL > 0 (templates_cuda_norm.h fuse_values; the default where the split would be and the
//     input fits L2), for rows of up to a few MB: one launch, a
//     cluster of CL blocks a row, each block the Welford statistics of its slice; after a cluster
//     barrier every block combines the CL partials in the same order and normalizes its own
//     slice, whose second read then comes from L2 (knob "resident" caps the blocks an SM so the
//     slices read at once fit there), or with regs from registers (RI vectors a thread). DRAM
//     sees one read and one write, where the split reads the input twice once it is larger than L2.
// Statistics are fp32; the input is read through VEC-wide vectors, which requires VEC | HxW so
// that a vector never straddles two channels.
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_group_norm.h"
#include "evolve/propose/templates_cuda_norm.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

// Vectors a thread normalises in the plane pass (launch 2 of the split strategy).
constexpr int64_t kApplyItems = 4;


struct GnGeom {
  int64_t n = 0, c = 0, hw = 0, group = 0, m = 0, l = 0;   // m rows of l elements
  DType x = DType::kF32, p = DType::kF32, s = DType::kF32;  // input, parameters, statistics
  bool has_w = false, has_b = false;                           // weight / bias present
};

bool defined(const TensorMeta* t) { return t && t->defined; }

// The call's geometry and dtypes; false when this template does not handle it.
bool gn_geometry(const OpCall& c, GnGeom& g) {
  if (c.backend != BackendKind::kCuda || c.op != OpId::kGroupNorm || !c.dense() || c.outputs.size() != 3) return false;
  const TensorMeta* x = c.input("input");
  if (!x || !x->defined || !elem_dtype(x->dtype) || x->numel() == 0) return false;
  g.x = g.p = x->dtype;
  g.n = c.int_arg("N", 0), g.c = c.int_arg("C", 0), g.hw = c.int_arg("HxW", 0), g.group = c.int_arg("group", 0);
  if (g.n <= 0 || g.c <= 0 || g.hw <= 0 || g.group <= 0 || g.c % g.group != 0) return false;
  if (g.n * g.c * g.hw != x->numel() || !c.scalar("eps")) return false;
  g.m = g.n * g.group;
  g.l = g.c / g.group * g.hw;
  if (g.l > INT_MAX / 2 || g.m > INT_MAX || g.n * g.c > INT_MAX) return false;
  const TensorMeta* w = c.input("weight");
  const TensorMeta* b = c.input("bias");
  g.has_w = defined(w), g.has_b = defined(b);
  for (const TensorMeta* t : {w, b}) {
    if (!defined(t)) continue;
    if (t->numel() != g.c || (t->dtype != g.x && t->dtype != DType::kF32)) return false;
    g.p = t->dtype;
  }
  if (g.has_w && g.has_b && w->dtype != b->dtype) return false;   // one parameter type
  if (!c.outputs[0].defined || c.outputs[0].dtype != g.x || c.outputs[0].sizes != x->sizes) return false;
  g.s = c.outputs[1].dtype;
  if (g.s != g.x && g.s != DType::kF32) return false;
  for (int i = 1; i < 3; ++i)
    if (!c.outputs[i].defined || c.outputs[i].dtype != g.s || c.outputs[i].numel() != g.m) return false;
  return true;
}

// Threads, rows, vec (must divide HxW: a vector stays in one channel), regs, split.
std::vector<KnobDim> gn_space(const GnGeom& g) {
  std::vector<KnobDim> sp;
  auto vecs = vec_values(g.x, g.hw);
  const int64_t vec = vecs.back();
  const int64_t nt = std::clamp<int64_t>(pow2_ceil(cdiv(g.l / vec, 8)), 32, 1024);
  sp.push_back({"threads", with_default({32, 64, 128, 256, 512, 1024}, nt)});
  sp.push_back({"rows", with_default({1, 2, 4, 8}, nt == 32 ? 4 : 1)});
  sp.push_back({"vec", with_default(vecs, vec)});
  const bool fits = pow2_ceil(cdiv(g.l / vec, nt)) * vec <= reg_budget(nt == 32 ? 128 : nt);
  sp.push_back({"regs", fits ? std::vector<int64_t>{1, 0} : std::vector<int64_t>{0, 1}});
  auto splits = split_values(g.m, g.l);
  // Few rows (where the split is the default): the fused launch instead when the input fits L2,
  // at 512 threads and 2 blocks an SM. On an H100 (2026-12-06), fp32 (8,320,64,64) with 32 groups
  // (42 MB) took 0.053 ms fused against 0.076 split and 0.066 a block a row, while (16,64,256,256)
  // with 8 groups (268 MB) took 0.287 split against 0.306 at best fused.
  const auto fuse = fuse_values(g.m, g.l, dtype_size(g.x));
  const bool fused = splits.front() != 0 && fuse.front() != 0 && g.n * g.c * g.hw * dtype_size(g.x) <= kL2Bytes;
  if (splits.front() != 0) sp[0].values = with_default(sp[0].values, fused ? 512 : 256);   // block of the split kernels
  sp.push_back({"split", fused ? with_default(splits, 0) : splits});
  sp.push_back({"fuse", fused ? fuse : with_default(fuse, 0)});
  sp.push_back({"resident", with_default(resident_values(), fused ? 2 : 0)});
  return sp;
}


// Parameter and statistics types with their conversions, and the optional weight / bias
// parameters (the launch spec may only name present tensors).
std::string gn_types(const GnGeom& g) {
  std::string s = std::string("typedef ") + ctype(g.s) + " ST;\n";
  s += g.s == DType::kF32 ? "__device__ __forceinline__ ST sts(float v) { return v; }\n"
                          : "__device__ __forceinline__ ST sts(float v) { return st(v); }\n";
  return s + affine_prelude(g.p, g.has_w, g.has_b);
}

class GroupNormTemplate : public Template {
 public:
  const char* name() const override { return "cuda.group_norm"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    GnGeom g;
    return gn_geometry(c, g) ? gn_space(g) : std::vector<KnobDim>{};
  }

  // The fused launch where its slices are at most 256 KB (fuse_values' own default), at one or
  // two wide blocks an SM so that the slices read at once fit L2, as cuda.batch_norm's seeds.
  std::vector<Knobs> seeds(const OpCall& c) const override {
    GnGeom g;
    if (!gn_geometry(c, g)) return {};
    const int64_t cl = fuse_values(g.m, g.l, dtype_size(g.x)).front();
    if (cl == 0) return {};
    std::vector<Knobs> out = {{{"fuse", cl}, {"threads", 1024}, {"resident", 1}}, {{"fuse", cl}, {"threads", 512}, {"resident", 2}}};
    for (Knobs& k : register_slice_seeds(g.m, g.l, dtype_size(g.x), vec_values(g.x, g.hw).back())) out.push_back(k);
    return out;
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    GnGeom g;
    if (!gn_geometry(c, g)) return unsupported("cuda.group_norm does not handle this call");
    auto kr = pick(gn_space(g), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    // A split setting is the split (whatever fuse's default); resident caps the fused launch only.
    if (k.at("split") > 0) k["fuse"] = 0;
    const int64_t fuse = k.at("fuse");
    if (fuse == 0) k["resident"] = 0;
    const int64_t split = k["split"];
    // The split streams its chunks; the fused launch keeps its slice in registers with regs (RI
    // vectors a thread), not the row (the row kernel's ITEMS).
    const bool slice_regs = fuse > 0 && k.at("regs");
    if (split > 0 || fuse > 0) {
      k["regs"] = 0;
      k["rows"] = 1;
    }
    auto gr = row_geom(k, g.l);
    if (!gr.is_ok()) return gr.status();
    const RowGeom r = gr.value();
    if (slice_regs) k["regs"] = 1;
    const int64_t ri = slice_regs ? slice_items(g.l / r.vec, fuse, r.g) : 0;
    if (!slice_fits(ri, r.vec, r.g))
      return unsupported("a slice of " + S(ri) + " vectors a thread does not fit " + S(r.g) + " threads' registers");
    const std::string src = "// kernelcraft cuda.group_norm " + std::string(dtype_name(g.x)) + " params " +
                            dtype_name(g.p) + " stats " + dtype_name(g.s) + "\n" + dtype_prelude(g.x) +
                            row_consts(r) + "constexpr int KA = " + S(kApplyItems) + ", RI = " + S(ri) + ";\n" +
                            cluster_consts(fuse) +
                            gn_types(g) + kGroupHelpers + kFusedNormHelpers + group_norm_kernels();
    auto lr = launches(g, r, split, fuse, k.at("resident"));
    if (!lr.is_ok()) return lr.status();
    return make_candidate(name(), std::move(k), src, std::move(lr.value().first), std::move(lr.value().second));
  }

 private:
  // The launch list and scratch of a setting. Sizes come from the call's scalars.
  static Result<std::pair<json, json>> launches(const GnGeom& g, const RowGeom& r, int64_t split, int64_t fuse,
                                                int64_t resident) {
    const std::string Ms = "N * group", Ls = "C / group * HxW", Cpg = "C / group";
    std::vector<std::string> wb;
    if (g.has_w) wb.push_back("ptr:weight");
    if (g.has_b) wb.push_back("ptr:bias");
    auto cat = [](std::vector<std::string> a, const std::vector<std::string>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const std::vector<std::string> head = cat({"ptr:out0", "ptr:out1", "ptr:out2", "ptr:input"}, wb);
    json ls = json::array();
    if (fuse > 0) {
      const std::string blocks = Ms + " * " + S(fuse);
      ls.push_back(launch("kc_group_norm_fused", {blocks}, {r.g},
                          cat({"ptr:out0", "ptr:out1", "ptr:out2", "ptr:part", "ptr:input"},
                              cat(wb, {"i32:" + Ls, "i32:HxW", "i32:" + Cpg, "i32:group", "f32:eps"}))));
      ls.back()["smem"] = reserve_smem(resident);
      return std::make_pair(ls, json::array({{{"name", "part"}, {"bytes", blocks + " * 8"}}}));
    }
    if (split == 0) {
      ls.push_back(launch("kc_group_norm", {row_grid(r, Ms)}, {r.g * r.rpb},
                          cat(head, {"i64:" + Ms, "i32:" + Ls, "i32:HxW", "i32:" + Cpg, "i32:group", "f32:eps"})));
      return std::make_pair(ls, json());
    }
    const int64_t pieces = cdiv(g.hw / r.vec, kApplyItems * r.g);
    if (g.n * g.c * pieces > INT_MAX) return unsupported("too many plane pieces for one grid");
    const std::string P = "ceil_div(HxW / " + S(r.vec) + ", " + S(kApplyItems * r.g) + ")";
    const std::string blocks = Ms + " * " + S(split);
    ls.push_back(launch("kc_group_norm_part", {blocks}, {r.g}, {"ptr:part", "ptr:input", "i64:" + Ls, "i32:" + S(split)}));
    ls.push_back(launch("kc_group_norm_apply", {"N * C * " + P}, {r.g},
                        cat(head, {"ptr:part", "i32:C", "i32:HxW", "i32:" + Cpg, "i32:" + S(split), "i32:" + P, "f32:eps"})));
    json scratch = json::array({{{"name", "part"}, {"bytes", blocks + " * 8"}}});
    return std::make_pair(ls, scratch);
  }
};

}  // namespace

const Template* cuda_group_norm_template() {
  static const GroupNormTemplate t;
  return &t;
}

}  // namespace kc::evolve
