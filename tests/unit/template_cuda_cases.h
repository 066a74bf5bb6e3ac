// The cases of the CUDA template tests without a GPU (test_templates_cuda.cpp): per family, calls
// at the measured shapes, odd shapes and each dtype, with how many random knob settings to sample.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/proposer.h"
#include "runtime/ops.h"
#include "runtime/tensor_meta.h"

namespace kc::evolve::cuda_cases {

using nlohmann::json;

struct Case {
  OpId op;
  std::vector<int64_t> sizes;
  DType dt;
  json args;
  int samples = 2;                // random knob settings besides the defaults
  std::vector<Knobs> extra = {};  // settings that must be covered (compiled) whatever the sample
};

std::string describe(const Case& k);
std::vector<Case> cases();
// The case's call (a gtest failure, and an empty call, where make_call refuses it).
OpCall call_of(const Case& k);
// The one CUDA template whose space is not empty for c (a gtest failure if two claim it).
const Template* cuda_template_for(const OpCall& c);

}  // namespace kc::evolve::cuda_cases
