// The runner of the CUDA template GPU tests (template_gpu_run.cpp), shared by the test files of
// kc_template_gpu_tests: the fixture (skips without a device), a case (op, shape, dtype, arguments, knob
// samples) and run_all, which checks every sampled candidate of each case against the fp64
// references (template_gpu_reference.h).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/proposer.h"
#include "tests/gpu/gpu_fixture.h"

namespace kc::evolve::gpu_run {

struct Gpu : GpuFixture {
  void SetUp() override;
  std::string download(CUdeviceptr p, size_t bytes);
};

struct Case {
  OpId op;
  std::vector<int64_t> sizes;
  DType dt;
  nlohmann::json args;
  int samples;                    // random knob settings besides the defaults
  std::vector<Knobs> extra = {};  // settings that must be covered
};

std::string describe(const Case& k);

// How much a half output may be off beyond rtol * scale. kUlp: one ulp of the case's dtype (the
// families that may round more than once); kOnce: half an ulp of each output's own dtype, what one
// rounding of an fp32 result costs (fp32 outputs of a half call get none).
enum class Rounding { kUlp, kOnce };

void run_all(Gpu& g, const std::vector<Case>& cs, double rtol, Rounding rounding = Rounding::kUlp);

// One timed candidate: its id and its median (runtime/timing.h: L2 flushed, events).
struct Timed {
  Knobs knobs;
  std::string id;
  double median_ms = 0;
};
// Times the candidate of `c` at each setting of `knobs` on zeroed inputs into `out` (settings its
// template refuses are skipped); a failed compile, load or timing fails the test.
void time_candidates(Gpu& g, const OpCall& c, const std::vector<Knobs>& knobs, double budget_ms, std::vector<Timed>& out);

}  // namespace kc::evolve::gpu_run
