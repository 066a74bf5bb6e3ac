// The runner of the CUDA template GPU tests (template_gpu_run.cpp), shared by the test files of
// kc_template_gpu_tests: the fixtures (Gpu skips without a device; Emulated runs what it can on
// the host), a case (op, shape, dtype, arguments, knob samples) and run_all, which checks every
// sampled candidate of each case against the fp64 references (template_gpu_reference.h).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/proposer.h"
#include "tests/gpu/gpu_fixture.h"

namespace kc::evolve::gpu_run {

// The device a case runs on: the GPU (skips without one) or, for Emulated, the host emulation
// (template_emu.h). run_all goes through these, and b (the backend), only.
struct Gpu : GpuFixture {
  void SetUp() override;
  virtual CUdeviceptr buffer(size_t bytes) { return alloc(bytes); }
  virtual void upload(CUdeviceptr p, const std::string& bytes);
  virtual void fill(CUdeviceptr p, unsigned char byte, size_t bytes);
  virtual void finish();   // waits for the launches
  virtual std::string download(CUdeviceptr p, size_t bytes);
  int64_t max_numel = -1;  // cases with a larger tensor are skipped (-1: none)
  bool sampled = true;     // the random knob samples of each case, besides its defaults and extras
};

// The same cases without a GPU: candidates whose sources can be emulated (template_emu.h) run on
// the host, one thread at a time, at shapes up to max_numel; the others are counted unsupported.
struct Emulated : Gpu {
  void SetUp() override;
  void TearDown() override;
  CUdeviceptr buffer(size_t bytes) override;
  void upload(CUdeviceptr p, const std::string& bytes) override;
  void fill(CUdeviceptr p, unsigned char byte, size_t bytes) override;
  void finish() override {}
  std::string download(CUdeviceptr p, size_t bytes) override;
  std::vector<void*> host;
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

// Returns how many candidates were checked (kUnsupported settings and sources not counted).
int run_all(Gpu& g, const std::vector<Case>& cs, double rtol, Rounding rounding = Rounding::kUlp);

// One timed candidate: its id and its median (runtime/timing.h: L2 flushed, events).
struct Timed {
  Knobs knobs;
  std::string id;
  double median_ms = 0;
};
// Times the candidate of `c` at each setting of `knobs` on zeroed inputs into `out` (settings its
// template refuses are skipped); a failed compile, load or timing fails the test. KC_TIMING_ONCE
// set in the environment: one warm-up and one timed launch a setting (for ncu).
void time_candidates(Gpu& g, const OpCall& c, const std::vector<Knobs>& knobs, double budget_ms, std::vector<Timed>& out);

}  // namespace kc::evolve::gpu_run
