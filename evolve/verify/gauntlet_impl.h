// The gauntlet's working state (internal to gauntlet.cpp and gauntlet_setup.cpp): the call, its
// device and backend, the reference input sets, and the helpers every stage uses to allocate,
// poison, launch and synchronise.
#pragma once
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "evolve/ops/eager.h"
#include "evolve/verify/gauntlet.h"
#include "evolve/verify/memory_cap.h"
#include "evolve/verify/numerics.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {

struct Gauntlet::Impl {
  OpCall call;
  int device = 0;
  at::Device dev = at::kCPU;
  GauntletOptions opt;
  Backend* be = nullptr;
  // The reference input sets, in order. When the key is too large to keep them all (memory_cap.h
  // sets_resident), each holds only its name and budgets, and acquire() rebuilds its tensors from
  // `sources` for the stage that needs them: one set's tensors alive at a time.
  std::vector<InputSet> sets;
  struct SetSource {
    std::string kind;
    uint64_t seed = 0;
    std::vector<at::Tensor> captured;   // the "captured" set's inputs (nothing to regenerate them from)
  };
  std::vector<SetSource> sources;
  bool resident = true;
  std::optional<Timing> eager;
  bool lost = false;
  std::unique_ptr<Launcher> scrub;     // fills shared memory with NaN before each candidate call
  uint64_t fresh_seed = 1000;

  bool cuda() const { return call.backend == BackendKind::kCuda; }

  Status sync() {
    if (!cuda()) return Status::ok();
    auto d = cuda_driver();
    if (!d) return d.status();
    CUresult r = d.value()->cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
      lost = true;
      return Status::error(Code::kLaunchError, "device fault: " + cu_error(*d.value(), r));
    }
    return Status::ok();
  }

  std::vector<at::Tensor> source_inputs(const SetSource& src) const {
    if (!src.captured.empty()) return src.captured;
    return make_inputs(call, src.kind, src.seed, dev);
  }

  Status make_set(SetSource src) {
    auto set = reference_set(call, src.kind, source_inputs(src));
    if (!set) return set.status();
    InputSet& s = set.value();
    if (!resident) {   // keep the budgets; the tensors are rebuilt when needed
      s.inputs.clear(); s.ref.clear(); s.ref64.clear(); s.tol.clear();
      s.care = at::Tensor(); s.denormal_in = at::Tensor();
    }
    sets.push_back(std::move(s));
    sources.push_back(std::move(src));
    return Status::ok();
  }

  // sets[i] with its tensors: itself when resident, else rebuilt into *tmp (same inputs, same
  // references; the budgets measured when the set was first built).
  Result<const InputSet*> acquire(size_t i, InputSet* tmp) {
    if (resident) return &sets[i];
    auto set = reference_set(call, sets[i].name, source_inputs(sources[i]));
    if (!set) return set.status();
    *tmp = std::move(set.value());
    tmp->budget = sets[i].budget;
    tmp->tau = sets[i].tau;
    tmp->eager_err = sets[i].eager_err;
    return static_cast<const InputSet*>(tmp);
  }

  int normal_index() const {
    for (size_t i = 0; i < sets.size(); ++i)
      if (sets[i].name == "normal") return static_cast<int>(i);
    return -1;
  }

  void poison(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& scratch) {
    for (auto& o : outs)
      if (o.defined()) {
        if (o.is_floating_point()) o.fill_(NAN);
        else o.fill_(-1);
      }
    for (auto& s : scratch) s.fill_(0xFF);
  }

  std::vector<at::Tensor> alloc_outputs() {
    std::vector<at::Tensor> outs;
    for (const auto& m : call.outputs) outs.push_back(empty_like_meta(m, dev));
    return outs;
  }

  std::vector<at::Tensor> alloc_scratch(const ResolvedSpec& spec) {
    std::vector<at::Tensor> s;
    for (int64_t b : spec.scratch_bytes) s.push_back(at::empty({b}, at::TensorOptions().dtype(at::kByte).device(dev)));
    return s;
  }

  Status launch(Launcher& l, const ResolvedSpec& spec, const std::vector<at::Tensor>& in, std::vector<at::Tensor>& outs,
                std::vector<at::Tensor>& scratch) {
    std::vector<void*> ptrs;
    for (const auto& t : in) ptrs.push_back(t.defined() ? t.data_ptr() : nullptr);
    for (auto& t : outs) ptrs.push_back(t.defined() ? t.data_ptr() : nullptr);
    for (auto& t : scratch) ptrs.push_back(t.data_ptr());
    if (static_cast<int>(ptrs.size()) != spec.num_slots())
      return Status::error(Code::kInvalid, "the spec's pointer slots do not match the call");
    ExecContext ctx;
    if (!cuda()) {
      static const ParallelFor pf = [](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
        at::parallel_for(0, n, 1, fn);
      };
      ctx.parallel_for = pf;
    }
    return l.run(ptrs.data(), ctx);
  }

  void scrub_smem() {
    if (!scrub) return;
    static void* none[1] = {nullptr};
    ExecContext ctx;
    scrub->run(none, ctx).ignore();
  }

  // One eager call on `in` (the reference the candidate is timed against), errors as a Status.
  Status eager_call(const std::vector<at::Tensor>& in) {
    try {
      run_eager_timed(call, in);
    } catch (const std::exception& e) {
      return Status::error(Code::kLaunchError, e.what());
    }
    return Status::ok();
  }

  void make_scrubber() {
    // Leftovers from an earlier kernel are what an uninitialised shared-memory read returns; make
    // them NaN so such reads show in the numerics instead of passing by luck.
    const char* src =
        "extern \"C\" __global__ void kc_scrub() {\n"
        "  extern __shared__ unsigned int s[];\n"
        "  unsigned int n = 98304 / 4;\n"
        "  for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 0x7fc00000u;\n"
        "  __syncthreads();\n"
        "  if (s[threadIdx.x] == 1u) s[0] = 0u;\n"
        "}\n";
    auto bin = be->compile(src);
    if (!bin) return;
    LaunchSpec spec;
    LaunchSpec::Launch l;
    l.entry = "kc_scrub";
    l.grid[0] = "264"; l.grid[1] = "1"; l.grid[2] = "1";
    l.block[0] = "1024"; l.block[1] = "1"; l.block[2] = "1";
    l.smem = "98304";
    spec.launches.push_back(l);
    auto r = resolve(spec, Binding{});
    if (!r) return;
    auto ld = be->load(bin.value().binary, r.value());
    if (ld) scrub = std::move(ld.value());
  }
};

}  // namespace kc::evolve
