// The gauntlet's working state (internal to gauntlet.cpp and gauntlet_setup.cpp): the call, its
// device and backend, the reference input sets, and the helpers every stage uses to allocate,
// poison, launch and synchronise.
#pragma once
#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "evolve/eager.h"
#include "evolve/gauntlet.h"
#include "evolve/numerics.h"
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
  std::vector<InputSet> sets;
  std::optional<Timing> eager;
  bool lost = false;
  std::unique_ptr<Launcher> scrub;     // fills shared memory with NaN before each candidate call
  uint64_t fresh_seed = 1000;

  bool cuda() const { return call.backend == "cuda"; }

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

  Status make_set(const std::string& name, std::vector<at::Tensor> inputs) {
    auto set = reference_set(call, name, std::move(inputs));
    if (!set) return set.status();
    sets.push_back(std::move(set.value()));
    return Status::ok();
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
      run_eager(call, in);
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
