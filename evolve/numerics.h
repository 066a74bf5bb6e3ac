// Numerics of the gauntlet: an input set with its eager and fp64 references and error budgets,
// and the comparison of a candidate's output against them (evolve/gauntlet.h, stage "numerics").
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "evolve/op_call.h"
#include "runtime/status.h"

namespace kc::evolve {

struct InputSet {
  std::string name;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> ref, ref64;   // eager and fp64 outputs
  std::vector<double> budget, tau;      // per output
  std::vector<double> eager_err;        // eager's own error against fp64, per output
  // Elements compared (undefined: all). The special set checks that non-finite inputs do not
  // spill into other elements; what an op returns *at* a NaN/inf input is left open (fmaxf-style
  // relu returns 0 for NaN where torch propagates it: a convention, not a defect).
  at::Tensor care;
  // Elementwise ops: where some input is a (non-zero) denormal. A flush-to-zero kernel reads those
  // as zero; that, not a formula that underflows differently, is what the denormal check is for.
  at::Tensor denormal_in;
};

// An input set for `call`: eager's and the fp64 outputs on `inputs`, and per output the error
// measure's tau (a tenth of the fp64 output's rms), eager's own error against fp64 and the budget
// a candidate gets: 4x eager's error, at least 16 units of roundoff of the output dtype (or of
// bf16/tf32 under those precision policies), times max(1, sqrt(K)/8) for outputs that sum K inputs
// each (the growth of plain fp32 accumulation). kInvalid if eager disagrees with the call's outputs.
Result<InputSet> reference_set(const OpCall& call, const std::string& name, std::vector<at::Tensor> inputs);

// max_i |x - r64| / (|r64| + tau) over positions where the eager reference is finite (and `care`,
// when defined, is true); *where gets the flat index of the maximum. Chunked: fixed temporaries.
double rel_err(const at::Tensor& x, const at::Tensor& ref, const at::Tensor& r64, double tau, int64_t* where,
               const at::Tensor& care);

// Compares one output with eager (`ref`) and fp64 (`r64`); on failure the evidence: the check
// that failed, the first offending index, expected / fp64 / actual values, error and budget.
std::optional<nlohmann::json> compare(const std::string& out_name, const at::Tensor& x, const at::Tensor& ref,
                                      const at::Tensor& r64, double budget, double tau, const at::Tensor& care,
                                      const at::Tensor& denormal_in);

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
