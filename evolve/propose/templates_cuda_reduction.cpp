// CUDA reduction template (cuda.reduction): sum, mean, amax, amin, argmax, argmin, var, std,
// var_mean, std_mean, linalg_vector_norm, max.dim, min.dim, prod.dim_int and logsumexp over one
// block of adjacent dims, or two blocks around the kept ones.
// Part of the CUDA op-family templates; shared pieces in templates_cuda_common.h, the fold state
// of each kind in templates_cuda_reduction_states.cpp.
//
// The input is viewed as [outer, r, inner] (reduction.h). Every op is a fold state S with
// kc_init / kc_add (one element and its index along r) / kc_merge / kc_store, so one set of
// kernels serves all of them:
//   inner == 1 (rows): a group of threads (a warp, the whole block, or for short rows 4 to 16
//     lanes of a warp) folds one row of r contiguous elements through VEC-wide loads, U loads in
//     flight per thread.
//   inner > 1 (columns): a block of TX x TY threads covers TX * VB adjacent columns of one outer
//     slice; each thread folds its VB columns over every TY-th row (coalesced across tx), then
//     the TY partial states of a column are merged through shared memory.
//   split = SP > 0, for few outputs and long reductions: each of SP blocks folds a chunk of r
//     and writes its state to scratch; a second launch merges a column's SP states in a fixed
//     order (a warp per output), so results are deterministic run to run.
//   two runs [r1, mid, r2] (dims (0, 2, 3) of NCHW): each of the r1 * mid rows of r2 contiguous
//     elements is folded as in the rows case into scratch, and the finishing launch of split
//     merges an output's r1 states in order (kSegBody).
// Accumulation is fp32 for every dtype (products too, as eager's CUDA prod). Ties of argmax /
// argmin / max.dim / min.dim go to the lowest index and the lowest-index NaN wins, as in eager
// (ATen's CUDA comparators order equal values and NaNs by index), whatever the merge order
// (kc_better compares indices).
#include <algorithm>
#include <climits>
#include <tuple>
#include <utility>

#include "evolve/ops/reduction.h"
#include "evolve/propose/templates_cuda_common.h"
#include "evolve/propose/templates_cuda_reduction.h"

namespace kc::evolve {
namespace {

using namespace cuda_tpl;
using nlohmann::json;

constexpr int64_t kMergeShared = 32768;   // bytes of the column merge's states (one per thread and column)

struct RedCall {
  ReduceGeom g;
  DType x = DType::kF32, o = DType::kF32;
  bool two = false;   // var_mean / std_mean (a second o), max / min.dim (int64 indices): a second output
};

// The call's geometry; false when this template does not handle it.
bool red_call(const OpCall& c, RedCall& rc) {
  if (c.backend != BackendKind::kCuda || op_info(c.op).family != OpFamily::kReduction || !c.dense() || c.outputs.empty())
    return false;
  const TensorMeta* x = c.input("self");
  if (!x || !x->defined || !elem_dtype(x->dtype) || x->numel() == 0) return false;
  auto g = reduce_geometry(c);
  if (!g.is_ok()) return false;
  const bool rows_cols = g->block && g->outer * g->r * g->inner == x->numel();
  const bool two = g->two_runs && !indexed(g->kind) && g->r1 * g->mid * g->r2 == x->numel();
  if (!rows_cols && !two) return false;
  rc.g = g.value();
  rc.g.block = rows_cols;
  rc.x = x->dtype;
  rc.o = c.outputs[0].dtype;
  rc.two = c.outputs.size() == 2;
  const ReduceKind k = rc.g.kind;
  if (k == ReduceKind::kArgMax || k == ReduceKind::kArgMin) {
    if (rc.o != DType::kI64) return false;
  } else if (k == ReduceKind::kMaxDim || k == ReduceKind::kMinDim) {
    if (rc.o != rc.x || !rc.two || c.outputs[1].dtype != DType::kI64) return false;
  } else if (rc.o != rc.x && rc.o != DType::kF32) {
    return false;
  }
  if (welford(k) && rc.g.r > (int64_t{1} << 24)) return false;   // the count is an exact fp32 integer
  return rc.g.block ? rc.g.outer * rc.g.inner < (int64_t{1} << 40) : rc.g.r1 * rc.g.mid <= INT_MAX;   // rows of the two-run grid
}

// Knobs. Rows (inner == 1): threads, rows (warps a block), vec, unroll, split. Columns: tx, ty,
// vec (columns a thread), unroll, split.
// The rows kernels' group and width for rows of n elements: threads, rows a block, vec.
// Short rows are also offered groups of 4 to 16 lanes, several rows a warp. Under 32 vectors a row
// (global pooling's 7x7 planes, var over 49 elements) that is the default: a warp of 32 lanes on a
// row of 49 floats loads only 12 vectors at a time, too few bytes in flight to cover DRAM latency.
// Up to 512 vectors it is a choice: a warp's per-row work (the misaligned head and tail, the
// shuffles, the store) is then shared by its rows, where rows of 1023 bf16 at a warp a row left
// var_mean and min.dim issue-bound (79-92% of the SM's issue on an H100). For such heavy states
// (Welford, value and index) and rows of 32 to 255 vectors the default is the group that gives
// each lane about 8 vectors: at (16, 4096, 1023) bf16, 16 lanes a row ran var_mean in 0.062 ms
// and min.dim in 0.070 ms against a warp's 0.071 and 0.088 (H100); a plain sum or mean, and the
// fp32 rows (255 vectors: a warp), were faster a warp a row.
void row_knobs(DType x, int64_t n, bool heavy, std::vector<KnobDim>& sp) {
  // Any width at any row length: the row kernels load a misaligned head and tail one by one.
  auto vecs = vec_values(x, 8);
  const int64_t vec = vecs.back();
  int64_t nt = std::clamp<int64_t>(pow2_ceil(cdiv(n / vec, 8)), 32, 1024);
  std::vector<int64_t> threads = {32, 64, 128, 256, 512, 1024};
  if (n / vec < 512) threads.insert(threads.begin(), {4, 8, 16});
  if (n / vec < 32)   // about two vectors a lane, and at least a vector's width of lanes (head / tail)
    nt = std::max(vec, std::clamp<int64_t>(pow2_ceil(cdiv(n / vec, 2)), 4, 32));
  else if (heavy && n / vec < 256)   // the largest group whose lanes keep about 8 vectors
    nt = std::max(vec, std::clamp<int64_t>(pow2_ceil(cdiv(n / vec, 8) + 1) / 2, 4, 32));
  sp.push_back({"threads", with_default(threads, nt)});
  sp.push_back({"rows", with_default({1, 2, 4, 8}, nt <= 32 ? 4 : 1)});
  sp.push_back({"vec", with_default(vecs, vec)});
}

// Rows a block and threads a block of the rows kernels: `rows` warps of 32 / G rows each where
// groups are a warp or less, else `rows` groups (one, as a block is a group then).
std::pair<int64_t, int64_t> row_block(const Knobs& k) {
  const int64_t g = k.at("threads"), w = k.at("rows");
  return g < 32 ? std::make_pair(w * (32 / g), 32 * w) : std::make_pair(w, g * w);
}

std::vector<KnobDim> red_space(const RedCall& rc) {
  const ReduceGeom& g = rc.g;
  std::vector<KnobDim> sp;
  std::vector<int64_t> splits = {0};
  if (!g.block) {   // two runs: the r1 states of an output are its split already
    row_knobs(rc.x, g.r2, false, sp);
    sp.push_back({"unroll", {4, 1, 2, 8}});
    if (g.kind == ReduceKind::kLogSumExp) sp.push_back({"exp2", {1, 0}});
    return sp;
  }
  int64_t unroll = 4;
  if (g.inner == 1) {
    row_knobs(rc.x, g.r, welford(g.kind) || indexed(g.kind), sp);
    for (int64_t s : {2, 4, 8, 16, 33, 66, 132, 264, 528, 1056})
      if (g.r / s >= 2048 && g.outer * s <= INT_MAX) splits.push_back(s);
  } else {
    std::vector<int64_t> vecs;
    for (int64_t v : {1, 2, 4, 8})
      if ((v <= 4 || rc.x != DType::kF32) && g.inner % v == 0) vecs.push_back(v);
    int64_t vb = 1;
    for (int64_t v : vecs)
      if (g.inner / v >= 32) vb = v;
    // 64 x 16 threads: on the H200 the fastest column setting the var search found at
    // (16, 4096, 1023) (129 us vs 221 us for 32 x 8): more rows in flight per column.
    const int64_t tx = std::clamp<int64_t>(pow2_ceil(g.inner / vb), 8, 64);
    // Fewer rows where the column merge's states would not fit its shared memory (argmax and
    // max.dim's 16-byte states at wide vectors: 32 x 32 x 8 x 16 B at (16, 256, 256) bf16).
    int64_t ty = std::clamp<int64_t>(1024 / tx, 1, 32);
    while (ty > 1 && tx * ty * vb * reduction_state_bytes(g.kind) > kMergeShared) ty /= 2;
    sp.push_back({"tx", with_default({8, 16, 32, 64, 128, 256}, tx)});
    sp.push_back({"ty", with_default({1, 2, 4, 8, 16, 32}, ty)});
    sp.push_back({"vec", with_default(vecs, vb)});
    for (int64_t s : {2, 4, 8, 16, 32, 64, 128, 256, 512})
      if (g.r / s >= 16) splits.push_back(s);
    // Rows in flight a thread: about 16 bytes of loads a lane (8 rows of single 16-bit columns),
    // and 8 for indexed states. On an H100 at (16, 4096, 1023) over dim 1, 8 rows ran 3-21% faster
    // than 4 in bf16 (sum, var, prod, amax, argmax) and 11% faster for fp32 argmax; the other fp32
    // ones 3% slower (2026-12-06).
    if (indexed(g.kind) || vb * dtype_size(rc.x) < 4) unroll = 8;
  }
  sp.push_back({"unroll", with_default({4, 1, 2, 8}, unroll)});
  if (g.kind == ReduceKind::kLogSumExp) sp.push_back({"exp2", {1, 0}});
  // Split by default when the outputs' blocks cannot fill the GPU: about 4 blocks an SM. Column
  // blocks count by their threads: under half the GPU's 2048 an SM. At (16, 4096, 1023) over dim 1,
  // 256 blocks of 64 x 16 ran 8-20% faster unsplit than in the 4 chunks that counting blocks asked
  // for (H100, sum / var / prod / amax, fp32 and bf16).
  const int64_t blocks = g.inner == 1 ? g.outer : g.outer * cdiv(g.inner, sp[0].values.front() * sp[2].values.front());
  const bool few = g.inner == 1 ? blocks < 2 * kSms : blocks * sp[0].values.front() * sp[1].values.front() < kSms * 1024;
  int64_t def = 0;
  if (few)
    for (int64_t s : splits)
      if (s > 0 && (def == 0 || blocks * def < 4 * kSms)) def = s;
  sp.push_back({"split", with_default(splits, def)});
  return sp;
}

// Output element type OT and sto(); for argmax OT is the int64 index, for max / min.dim the
// second output is the int64 index.
std::string out_prelude(const RedCall& rc) {
  std::string s;
  if (rc.o == DType::kI64) s = "typedef long long OT;\n";
  else if (rc.o == DType::kF32) s = "typedef float OT;\n__device__ __forceinline__ OT sto(float v) { return v; }\n";
  else s = "typedef T OT;\n__device__ __forceinline__ OT sto(float v) { return st(v); }\n";
  const bool pair = rc.g.kind == ReduceKind::kMaxDim || rc.g.kind == ReduceKind::kMinDim;
  const char* second = pair ? "long long" : "OT";
  s += rc.two ? std::string("#define KC_OUT_PARAMS OT* __restrict__ out0, ") + second +
                    "* __restrict__ out1\n#define KC_OUT_ARGS out0, out1\n"
              : "#define KC_OUT_PARAMS OT* __restrict__ out0\n#define KC_OUT_ARGS out0\n";
  return s;
}

class ReductionTemplate : public Template {
 public:
  const char* name() const override { return "cuda.reduction"; }
  BackendKind backend() const override { return BackendKind::kCuda; }

  std::vector<KnobDim> space(const OpCall& c) const override {
    RedCall rc;
    return red_call(c, rc) ? red_space(rc) : std::vector<KnobDim>{};
  }

  Result<Candidate> render(const OpCall& c, const Knobs& kin) const override {
    RedCall rc;
    if (!red_call(c, rc)) return unsupported("cuda.reduction does not handle this call");
    auto kr = pick(red_space(rc), kin);
    if (!kr.is_ok()) return kr.status();
    Knobs k = kr.value();
    const ReduceGeom& g = rc.g;
    std::string consts;
    int64_t g_threads = 32, rpb = 1, nt = 32, vec = 1, tx = 1, ty = 1, vb = 1;
    if (!g.block) {
      g_threads = k["threads"];
      if (g_threads > 32) k["rows"] = 1;
      std::tie(rpb, nt) = row_block(k);
      vec = k["vec"];
    } else if (g.inner == 1) {
      if (k["split"] > 0 && k["threads"] <= 32) k["threads"] = 256;   // a block per chunk
      g_threads = k["threads"];
      if (g_threads > 32 || k["split"] > 0) k["rows"] = 1;
      std::tie(rpb, nt) = row_block(k);
      vec = k["vec"];
      if (cdiv(g.outer, rpb) > INT_MAX) return unsupported("too many rows for one grid");
    } else {
      tx = k["tx"], ty = k["ty"], vb = k["vec"];
      if (tx * ty > 1024 || tx * ty < 32) return unsupported("block of " + S(tx * ty) + " threads");
      if (tx * ty * vb * reduction_state_bytes(g.kind) > kMergeShared) return unsupported("shared memory of the column merge");
      if (cdiv(g.inner, tx * vb) * g.outer > INT_MAX) return unsupported("too many column tiles for one grid");
      nt = tx * ty;
    }
    if (g_threads < vec) return unsupported("groups of " + S(g_threads) + " lanes cannot load a row's head of up to " + S(vec - 1));
    consts = "constexpr int G = " + S(g_threads) + ", WL = " + S(std::min<int64_t>(g_threads, 32)) + ", RPB = " + S(rpb) +
             ", VEC = " + S(vec) + ", TX = " + S(tx) + ", TY = " + S(ty) + ", VB = " + S(vb) + ", U = " + S(k["unroll"]) +
             ", NT = " + S(nt) + ";\n";
    const std::string src = "// kernelcraft cuda.reduction " + std::string(op_info(c.op).name) + " " + dtype_name(rc.x) +
                            " -> " + dtype_name(rc.o) + (!g.block ? " two runs" : g.inner == 1 ? " rows" : " columns") +
                            "\n" + dtype_prelude(rc.x) + consts + out_prelude(rc) +
                            reduction_fold_state(g, k.count("exp2") && k["exp2"]) + kRowOf + reduction_kernels(!g.block);
    auto lr = launches(rc, k);
    if (!lr.is_ok()) return lr.status();
    return make_candidate(name(), std::move(k), src, std::move(lr.value().first), std::move(lr.value().second));
  }

 private:
  // The launch list and scratch of a setting; sizes are the key's, so they are literals.
  static Result<std::pair<json, json>> launches(const RedCall& rc, const Knobs& k) {
    const ReduceGeom& g = rc.g;
    std::vector<std::string> outs = {"ptr:out0"};
    if (rc.two) outs.push_back("ptr:out1");
    auto with = [&](std::vector<std::string> tail) {
      std::vector<std::string> a = outs;
      a.insert(a.end(), tail.begin(), tail.end());
      return a;
    };
    const int64_t nout = g.block ? g.outer * g.inner : g.mid, split = g.block ? k.at("split") : g.r1;
    json ls = json::array(), scratch;
    if (!g.block) {
      const int64_t rows = g.r1 * g.mid;
      const auto [rpb, nt] = row_block(k);
      ls.push_back(launch("kc_red_seg_part", {S(cdiv(rows, rpb))}, {nt},
                          {"ptr:part", "ptr:self", "i64:" + S(g.mid), "i64:" + S(g.r1), "i64:" + S(g.r2)}));
    } else if (g.inner == 1) {
      const auto [rpb, nt] = row_block(k);
      if (split == 0) {
        ls.push_back(launch("kc_red_rows", {S(cdiv(g.outer, rpb))}, {nt}, with({"ptr:self", "i64:" + S(g.outer), "i64:" + S(g.r)})));
        return std::make_pair(ls, json());
      }
      const int64_t vec = k.at("vec"), ch = cdiv(cdiv(g.r, split), vec) * vec;
      ls.push_back(launch("kc_red_rows_part", {S(g.outer * split)}, {nt},
                          {"ptr:part", "ptr:self", "i64:" + S(g.r), "i32:" + S(split), "i64:" + S(ch)}));
    } else {
      const int64_t tiles = cdiv(g.inner, k.at("tx") * k.at("vec")), nt = k.at("tx") * k.at("ty");
      const std::string grid = S(g.outer * tiles);
      if (split == 0) {
        ls.push_back(launch("kc_red_cols", {grid}, {nt}, with({"ptr:self", "i64:" + S(g.inner), "i64:" + S(g.r), "i64:" + S(tiles)})));
        return std::make_pair(ls, json());
      }
      ls.push_back(launch("kc_red_cols_part", {grid, S(split)}, {nt},
                          {"ptr:part", "ptr:self", "i64:" + S(g.inner), "i64:" + S(g.r), "i64:" + S(tiles), "i64:" + S(cdiv(g.r, split))}));
    }
    ls.push_back(launch("kc_red_finish", {S(cdiv(nout, 8))}, {256}, with({"ptr:part", "i64:" + S(nout), "i32:" + S(split)})));
    scratch = json::array({{{"name", "part"}, {"bytes", S(nout * split * reduction_state_bytes(g.kind))}}});
    return std::make_pair(ls, scratch);
  }
};

}  // namespace

const Template* cuda_reduction_template() {
  static const ReductionTemplate t;
  return &t;
}

}  // namespace kc::evolve
