// What evolution knows about one call: the operator, its inputs' metadata and scalars (from the
// key), and its outputs' metadata. Torch-free: proposers and the search see only this.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/backend.h"
#include "runtime/ops.h"
#include "runtime/status.h"
#include "runtime/tensor_meta.h"

namespace kc::evolve {

struct OpCall {
  OpId op = OpId::kRelu;
  BackendKind backend = BackendKind::kCuda;   // the key's target's kind
  std::string key;                     // the cache key this call stands for ("" if made by hand)
  std::string target;                  // the key's target, e.g. "cuda-sm_90+drv-13.0+nvrtc-13.0"
  std::string policy = "fp32";
  std::vector<TensorMeta> inputs;      // schema order and names, as dispatcher/wrappers.inc binds them
  std::vector<TensorMeta> outputs;     // "out0", "out1", ...: contiguous, the eager op's shapes/dtypes
  std::vector<ScalarArg> scalars;

  const TensorMeta* input(const std::string& name) const;
  const ScalarArg* scalar(const std::string& name) const;
  int64_t int_arg(const std::string& name, int64_t dflt) const;
  double double_arg(const std::string& name, double dflt) const;
  std::string string_arg(const std::string& name, const std::string& dflt) const;
  std::vector<int64_t> list_arg(const std::string& name) const;
  // The launch-spec binding: inputs, then outputs, then scalars (the dispatcher's slot order).
  Binding binding() const;
  // True when every defined input and output is contiguous with a 16-byte aligned start.
  bool dense() const;
};

// Parses a cache key (kernel_cache/key.h schema) back into a call; outputs are inferred.
Result<OpCall> call_from_key(const std::string& key);

// A call from an op name, the lead tensor's sizes and dtype, and optional scalar overrides in JSON
// (e.g. {"dim": 1} or {"approximate": "tanh"}); other inputs (weights, gradients, saved stats) get
// the shapes the op needs. Used by `kernelcraft verify --shape` and tests.
Result<OpCall> make_call(OpId op, const std::vector<int64_t>& sizes, DType dtype,
                         BackendKind backend, const nlohmann::json& args = nlohmann::json::object());

// The outputs eager produces for contiguous inputs (undefined entries for masked-out grads).
// `backend` is the call's backend kind: a few ops' outputs differ by backend (batch norm's eval
// statistics).
Result<std::vector<TensorMeta>> infer_outputs(OpId op, const std::vector<TensorMeta>& inputs,
                                              const std::vector<ScalarArg>& scalars,
                                              BackendKind backend = BackendKind::kCuda);

// Re-derives the key of a call for `target` (inputs and scalars in schema order).
std::string call_key(const OpCall& c);

nlohmann::json to_json(const OpCall& c);
Result<OpCall> call_from_json(const nlohmann::json& j);

}  // namespace kc::evolve
