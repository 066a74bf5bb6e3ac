// Planted bad candidates, for tests only: active when KERNELCRAFT_PLANTED lists them (in the
// worker's environment), e.g. "fault,hang,wrong". They are fast on purpose, so they would win the
// search if verification let them through; tests check they never reach the cache and that the
// user's process survives them. Unary forward ops, CUDA and CPU.
#include <cstdlib>
#include <string>

#include "evolve/propose/proposer.h"

namespace kc::evolve {
namespace {

bool planted_on(const std::string& what) {
  const char* e = std::getenv("KERNELCRAFT_PLANTED");
  if (!e) return false;
  std::string s = std::string(",") + e + ",";
  return s.find("," + what + ",") != std::string::npos;
}

const char* kCudaBody[] = {
    // fault: writes far outside the output (an illegal address)
    "  if (i == 0) out[n + (1ll << 40)] = 1.0f;\n  if (i < n) out[i] = x[i] > 0.f ? x[i] : 0.f;\n",
    // hang: never returns (a loop on volatile global loads, which the compiler must keep; a loop on
    // a volatile local was optimised away by NVRTC on the H200)
    "  const volatile float* vx = x;\n  while (vx[0] == vx[0]) {}\n  if (i < n) out[i] = x[i];\n",
    // wrong: right shape, wrong values (skips the op on every 7th element)
    "  if (i < n) out[i] = (i % 7 == 0) ? x[i] : (x[i] > 0.f ? x[i] : 0.f);\n",
};
const char* kCpuBody[] = {
    "  if (ctx->begin == 0) { volatile float* p = 0; *p = 1.0f; }\n",
    "  const volatile float* vx = x;\n  while (vx[0] == vx[0]) {}\n",
    "  for (int64_t i = lo; i < hi; ++i) out[i] = (i % 7 == 0) ? x[i] : (x[i] > 0.f ? x[i] : 0.f);\n",
};
const char* kNames[] = {"fault", "hang", "wrong"};

class Planted : public Template {
 public:
  Planted(int kind, bool cuda) : kind_(kind), cuda_(cuda) {
    name_ = std::string(backend_name(cuda ? BackendKind::kCuda : BackendKind::kCpu)) + ".planted_" + kNames[kind];
  }
  const char* name() const override { return name_.c_str(); }
  BackendKind backend() const override { return cuda_ ? BackendKind::kCuda : BackendKind::kCpu; }
  std::vector<KnobDim> space(const OpCall& c) const override {
    if (!planted_on(kNames[kind_]) || op_info(c.op).family != OpFamily::kUnary || !c.dense() ||
        c.inputs[0].dtype != DType::kF32)
      return {};
    return {{"variant", {0}}};
  }
  Result<Candidate> render(const OpCall& c, const Knobs& k) const override {
    Candidate cand;
    cand.family = name_;
    cand.knobs = k;
    if (cuda_) {
      cand.source = std::string("extern \"C\" __global__ void kc_planted(float* out, const float* x, long long n) {\n") +
                    "  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n" + kCudaBody[kind_] + "}\n";
      cand.launch = {{"version", 1},
                     {"launches", {{{"entry", "kc_planted"}, {"grid", {"ceil_div(numel(self), 256)", 1, 1}},
                                    {"block", {256, 1, 1}}, {"smem", 0},
                                    {"args", {"ptr:out0", "ptr:self", "i64:numel(self)"}}}}}};
    } else {
      cand.source = std::string("extern \"C\" void kc_planted(const kc_cpu_ctx* ctx, void* const* args) {\n") +
                    "  float* out = KC_ARG(float*, args, 0);\n  const float* x = KC_ARG(const float*, args, 1);\n" +
                    "  const int64_t n = KC_ARG(int64_t, args, 2);\n" +
                    "  const int64_t lo = ctx->begin * 4096, hi = ctx->end * 4096 < n ? ctx->end * 4096 : n;\n" +
                    "  for (int64_t i = lo; i < hi; ++i) out[i] = x[i] > 0.f ? x[i] : 0.f;\n" + kCpuBody[kind_] + "}\n";
      cand.launch = {{"version", 1},
                     {"launches", {{{"entry", "kc_planted"}, {"grid", {"ceil_div(numel(self), 4096)", 1, 1}},
                                    {"block", {4096, 1, 1}}, {"smem", 0},
                                    {"args", {"ptr:out0", "ptr:self", "i64:numel(self)"}}}}}};
    }
    (void)c;
    return cand;
  }

 private:
  int kind_;
  bool cuda_;
  std::string name_;
};

}  // namespace

const std::vector<const Template*>& planted_templates() {
  static const std::vector<const Template*> v = {new Planted(0, true), new Planted(1, true), new Planted(2, true),
                                                 new Planted(0, false), new Planted(1, false), new Planted(2, false)};
  return v;
}

}  // namespace kc::evolve
