// One home per op family (the torch half): its eager reference, the inputs the gauntlet draws and
// the shape of its error model. The torch-free half is ops/family.h.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "evolve/ops/eager.h"
#include "evolve/ops/op_call.h"

namespace kc::evolve {

// How output j of a reduction is laid out in rows: the reduced axis and its length k, and whether
// the output is a per-row statistic ([rows, 1]) or per-column (summed over rows: layer norm
// backward's grad_weight and grad_bias). model false: elementwise, no reduction model.
struct RowLayout {
  bool model = false;
  int64_t dim = 0, k = 1;    // the lead input's reduced axis (-1: the flattened trailing k)
  bool stat = false, col = false;
  // The output is computed in fp32 and rounded once to its dtype: a bf16 / f16 output's budget is
  // the fp32 model plus that one rounding, not the model in the output's precision.
  bool rounds_once = false;
  // The unit roundoff is this dtype's rather than the output's (kOther: the output's): an fp32
  // output that eager computes from reduced-precision values (cross-entropy under autocast, whose
  // log-probabilities are bf16) is only that precise in eager, and the live check compares with eager.
  DType precision = DType::kOther;
};

// How an input is cut into chunks of rows for the error model.
enum class RowView { kRows, kStat, kWhole };   // [rows, k]; [rows, 1]; a parameter, whole

// One chunk of rows of every input (RowView), and output j's fp64 reference for those rows.
struct Chunk {
  std::vector<at::Tensor> in;
  at::Tensor r64;
};

struct FamilyReference {
  // The aten operator of c on inputs (schema order, undefined for absent ones), as a list of
  // c.outputs.size() entries (undefined for masked-out grads). Inputs may be float64 (run_fp64).
  std::vector<at::Tensor> (*eager)(const OpCall& c, const std::vector<at::Tensor>& in);
  // The input value kinds the gauntlet draws (eager.h); "special" only where non-finite inputs
  // have a defined elementwise answer.
  const std::vector<std::string>* kinds;
  double large_scale;   // the "large" kind: N(0,1) * this
  double offset;        // the "offset" kind: N(offset, 1)
  // Recomputes the inputs a call receives from its forward in training (saved outputs, mean and
  // rstd) from the drawn ones, in place; nullptr when every input is independent.
  void (*derive)(const OpCall& c, std::vector<at::Tensor>& in, at::Device dev);
  // The error model (numerics.h attach_tolerance); layout nullptr: elementwise.
  RowLayout (*layout)(const OpCall& c, const std::vector<at::Tensor>& in, size_t j);
  RowView (*view)(size_t input);   // how input k is cut into rows
  // Output j's condition magnitude for one chunk ([rows, k] or [rows, 1]); for a per-column
  // output, this chunk's column sums [1, k] (the caller sums the chunks).
  at::Tensor (*scale)(const OpCall& c, const Chunk& chunk, size_t j, const RowLayout& l);
  bool any_axis;   // reduces over any axis (dim): a model over a leading axis is moved back
  // Output j's condition magnitude for the whole call at once, output-shaped, from the inputs
  // (e.g. pooling: the magnitudes summed into each window); nullptr: layout/scale (or none).
  at::Tensor (*whole)(const OpCall& c, const std::vector<at::Tensor>& in, size_t j);
  // What the user's eager costs, for the timing stage only (no outputs kept); nullptr: `eager`.
  // A composite pair's eager returns more than the user's call computes (the forward's statistic;
  // the backward recomputes its forward), which would flatter a candidate timed against it.
  void (*timed)(const OpCall& c, const std::vector<at::Tensor>& in) = nullptr;
};

const FamilyReference& family_reference(OpFamily f);

// A composite's backward alone, as the user's eager runs it after its forward: `forward` builds
// the composite's output from leaf copies of `leaves` (wanted[i]: leaf i takes a gradient) once
// per input set, keeping its graph, and each call runs only autograd's backward of it on `grad`.
void backward_only(const std::vector<at::Tensor>& leaves, const std::vector<bool>& wanted, const at::Tensor& grad,
                   at::Tensor (*forward)(const OpCall&, const std::vector<at::Tensor>&), const OpCall& c);

// The layout of a family that reduces or scans the lead input along the call's "dim" (softmax,
// scans): every output in rows of that axis.
RowLayout dim_layout(const OpCall& c, const std::vector<at::Tensor>& in, size_t j);

// The families' models and the numerics' comparisons work over slices or chunks of about this
// many elements, so their fp64 temporaries stay a fixed size whatever the key (a key of 8 GiB
// tensors otherwise held several fp64 copies of its input on the device).
constexpr int64_t kModelSlice = int64_t{1} << 20;

// Calls f(r0, len) over rows [0, rows) of `per` elements each, in slices of about kModelSlice
// elements (at least one row a slice).
template <class F>
void for_each_model_slice(int64_t rows, int64_t per, F f) {
  const int64_t step = std::max<int64_t>(1, kModelSlice / std::max<int64_t>(per, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += step) f(r0, std::min(step, rows - r0));
}

// Shared by the families' references: an fp64 copy (never a view: the model works in place).
inline at::Tensor f64(const at::Tensor& t) { return t.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true); }
inline std::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace kc::evolve
