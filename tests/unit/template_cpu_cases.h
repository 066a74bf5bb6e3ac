// The cases of the CPU template tests (test_templates_cpu.cpp): per family, calls at odd and
// boundary shapes with the arguments and input offsets that exercise each template's paths.
#pragma once
#include <vector>

#include "tests/unit/template_cpu_harness.h"

namespace kc::evolve {

std::vector<Case> unary_cases();
std::vector<Case> unary_backward_cases();
std::vector<Case> softmax_cases(bool backward);
std::vector<Case> layer_norm_cases();
std::vector<Case> group_norm_cases();
std::vector<Case> batch_norm_cases();
std::vector<Case> batch_norm_backward_cases();
std::vector<Case> group_norm_backward_cases();
std::vector<Case> embedding_backward_cases();
std::vector<Case> pool_cases();
std::vector<Case> pool_backward_cases();
std::vector<Case> layer_norm_backward_cases();
std::vector<Case> scan_cases();
std::vector<Case> reduction_cases();
std::vector<Case> loss_cases();
std::vector<Case> loss_backward_cases();

}  // namespace kc::evolve
