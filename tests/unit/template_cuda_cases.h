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

}  // namespace kc::evolve::cuda_cases
