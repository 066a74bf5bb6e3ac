// Numerics of the gauntlet: an input set with its eager and fp64 references and error budgets,
// and the comparison of a candidate's output against them (evolve/verify/gauntlet.h, stage "numerics").
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"
#include "evolve/ops/reference.h"
#include "runtime/status.h"

namespace kc::evolve {

// The numerics work over flat chunks (or chunks of rows) of the models' slice (numerics.cpp,
// error_model.cpp).
constexpr int64_t kNumericsChunk = kModelSlice;

struct InputSet {
  std::string name;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> ref, ref64;   // eager and fp64 outputs
  // Per output, the absolute error a candidate may have at each element (float32, the output's
  // sizes; undefined: budget * (|r64| + tau)). See attach_tolerance.
  std::vector<at::Tensor> tol;
  // Per output: tau, and the budget in the mixed measure (max over elements of tol / (|r64| + tau):
  // one number for the live check and the evidence).
  std::vector<double> budget, tau;
  std::vector<double> eager_err;        // eager's own error against fp64, per output (mixed measure)
  std::vector<double> eager_ratio;      // eager's own max |ref - r64| / tol, per output (evidence)
  // The largest error / tol that compare() has seen per output: how far inside an accepted
  // candidate is (evidence only; mutable because compare() reads the set as a const reference).
  mutable std::vector<double> worst;
  // Elements compared (undefined: all). The special set checks that non-finite inputs do not
  // spill into other elements; what an op returns *at* a NaN/inf input is left open (fmaxf-style
  // relu returns 0 for NaN where torch propagates it: a convention, not a defect).
  at::Tensor care;
  // Elementwise ops: where some input is a (non-zero) denormal. A flush-to-zero kernel reads those
  // as zero; that, not a formula that underflows differently, is what the denormal check is for.
  at::Tensor denormal_in;
};

// An input set for `call`: eager's and the fp64 outputs on `inputs`, per output the error measure's
// tau (a tenth of the fp64 output's rms) and eager's own error against fp64, and the tolerance
// (attach_tolerance). kInvalid if eager disagrees with the call's outputs.
Result<InputSet> reference_set(const OpCall& call, const std::string& name, std::vector<at::Tensor> inputs);

// The error model (docs/DEFECTS.md "Error model"). Per output element, in fp64 from the inputs, the
// condition magnitude H: what a correct implementation in the output's precision rounds, with the
// terms a reduction sums weighted by g(K) = sqrt(K) (layer norm mean: |mean| + g mean|x|; softmax:
// y (1 + |x - max| + g (1 + sum y |x - max|)); ...). With u the unit roundoff of the output dtype
// (or bf16/tf32 under those policies), the tolerance is 4x eager's error (the mixed measure's
// scale, |r64| + tau), clamped to [max(16 u (|r64| + tau), kModelFloor u H), kModelCap u H]: an
// honest reduction in another order passes where eager is better than the model, and a poor eager
// does not open the budget past the cap. Elementwise ops (no reduction) keep max(4x eager's
// error, 16 u) (|r64| + tau). Needs s.inputs, ref64, tau and eager_err; fills tol,
// budget, eager_ratio and worst. Used for a set whose references were computed elsewhere too.
void attach_tolerance(const OpCall& call, InputSet& s);

// The factors of the model (above): the floor is what honest kernels in any summation order need
// (measured: docs/DEFECTS.md "Verification margins"), the cap what eager's evidence may raise it to.
constexpr double kModelFloor = 2;
constexpr double kModelCap = 16;

// max_i |x - r64| / (|r64| + tau) over positions where the eager reference is finite (and `care`,
// when defined, is true); *where gets the flat index of the maximum. Chunked: fixed temporaries.
double rel_err(const at::Tensor& x, const at::Tensor& ref, const at::Tensor& r64, double tau, int64_t* where,
               const at::Tensor& care);

// Compares output j of a candidate with the set's eager (`ref`) and fp64 (`ref64`) outputs; on
// failure the evidence: the check that failed, the first offending index, expected / fp64 / actual
// values, the absolute error, the allowed error there and their ratio, the mixed-measure error and
// budget. On success, records the worst error / tol ratio in set.worst[j].
std::optional<nlohmann::json> compare(const std::string& out_name, const at::Tensor& x, const InputSet& set,
                                      size_t j);

// Detects a kernel writing into its inputs. CPU: a hash of each input's whole storage (no second
// copy of a large key's inputs, and a write into the gaps of a strided input counts too). CUDA: a
// device copy of each input, compared bit for bit (device memory, not the host's).
class InputGuard {
 public:
  explicit InputGuard(const std::vector<at::Tensor>& inputs);
  // True if inputs[k] holds what it held when the guard was made.
  bool unchanged(size_t k, const at::Tensor& now) const;

 private:
  std::vector<at::Tensor> copies_;
  std::vector<size_t> hashes_;
};

// Same sizes, dtype and bytes (NaN payloads included).
bool same_bits(const at::Tensor& a, const at::Tensor& b);

// %.9g: enough digits to tell float values (and denormals) apart in a one-line summary.
std::string num(double v);

}  // namespace kc::evolve
