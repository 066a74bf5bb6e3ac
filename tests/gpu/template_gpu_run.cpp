// The runner of the CUDA template GPU tests (template_gpu_run.h): every sampled candidate of a
// case rendered, compiled and launched with outputs and scratch poisoned (NaN) first, compared
// against the fp64 reference (template_gpu_reference.cpp), inputs checked unchanged, and a second
// run that must agree bit for bit (float-atomic variants: that also matches the reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/propose/proposer.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"
#include "runtime/timing.h"
#include "tests/gpu/template_emu.h"
#include "tests/gpu/template_gpu_reference.h"
#include "tests/gpu/template_gpu_run.h"

namespace kc::evolve::gpu_run {
namespace {

using nlohmann::json;
using gpu_ref::Expect;
using gpu_ref::Host;
using gpu_ref::make_input;
using gpu_ref::reference;
using gpu_ref::Vec;

// A tensor's values (logical order) placed at their memory offsets, and back: channels-last
// calls upload and read their buffers in memory order.
Vec to_memory(const TensorMeta& m, const Vec& v, bool back = false) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t rest = static_cast<int64_t>(i), off = 0;
    for (int a = static_cast<int>(m.sizes.size()) - 1; a >= 0; --a) {
      off += (rest % m.sizes[a]) * m.strides[a];
      rest /= m.sizes[a];
    }
    if (back) out[i] = v[off];
    else out[off] = v[i];
  }
  return out;
}

// The CUDA template whose space holds `c` (nullptr: none).
const Template* template_for(const OpCall& c) {
  for (const Template* x : cuda_templates())
    if (!x->space(c).empty()) return x;
  return nullptr;
}

struct Counts {
  int candidates = 0, unsupported = 0;
};

// Runs every sampled candidate of `k` and compares against the fp64 reference.
void run_case(Gpu& g, const Case& k, Counts& counts, double rtol, Rounding rounding) {
  auto cr = make_call(k.op, k.sizes, k.dt, BackendKind::kCuda, k.args);
  ASSERT_TRUE(cr.is_ok()) << describe(k) << ": " << cr.status().to_string();
  const OpCall c = cr.value();
  const Template* t = template_for(c);
  ASSERT_NE(t, nullptr) << describe(k);
  auto sp = t->space(c);
  if (g.max_numel >= 0) {
    int64_t most = 0;   // the largest tensor (a loss's backward leads with a scalar grad_output)
    for (const auto* ts : {&c.inputs, &c.outputs})
      for (const TensorMeta& t : *ts) most = std::max(most, t.defined ? t.numel() : 0);
    if (most > g.max_numel) return;
  }

  // Knob settings: defaults, the extra ones, then random ones (deterministic).
  std::vector<Knobs> settings = {Knobs{}};
  for (const auto& e : k.extra) settings.push_back(e);
  std::mt19937_64 krng(std::hash<std::string>{}(describe(k)) & 0xffffffff);
  for (int i = 0; i < (g.sampled ? k.samples : 0); ++i) {
    Knobs kn;
    for (const auto& dim : sp) kn[dim.name] = dim.values[krng() % dim.values.size()];
    settings.push_back(kn);
  }
  std::vector<Candidate> cands;
  std::set<std::string> seen;
  for (const auto& kn : settings) {
    auto r = t->render(c, kn);
    if (!r.is_ok()) {
      ASSERT_EQ(r.status().code(), Code::kUnsupported) << r.status().to_string();
      ++counts.unsupported;
      continue;
    }
    if (seen.insert(r->id()).second) cands.push_back(r.value());
  }
  // Compile in parallel (NVRTC programs are independent).
  std::vector<Result<CompileOutput>> bins(cands.size(), Status::error(Code::kCompileError, "not compiled"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < cands.size();) bins[i] = g.b->compile(cands[i].source);
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < 8; ++i) pool.emplace_back(work);
  for (auto& th : pool) th.join();

  // Inputs.
  std::mt19937_64 rng(12345);
  std::map<std::string, Vec> in;
  std::vector<std::string> in_bytes;
  Binding bind = c.binding();
  std::vector<CUdeviceptr> tensor_ptrs(bind.tensors.size(), 0);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const TensorMeta& tm = c.inputs[i];
    if (!tm.defined) {
      in_bytes.emplace_back();
      continue;
    }
    Vec v;
    if ((tm.name == "mean" || tm.name == "rstd") && c.op == OpId::kLayerNormBackward) {
      // Saved statistics of the input, as the forward would have produced them (fp32).
      const Vec& x = in.at("input");
      const int64_t M = tm.numel(), N = static_cast<int64_t>(x.size()) / M;
      for (int64_t r = 0; r < M; ++r) {
        double mu = 0, var = 0;
        for (int64_t j = 0; j < N; ++j) mu += x[r * N + j];
        mu /= N;
        for (int64_t j = 0; j < N; ++j) var += (x[r * N + j] - mu) * (x[r * N + j] - mu);
        v.push_back(static_cast<float>(tm.name == "mean" ? mu : 1 / std::sqrt(var / N + 1e-5)));
      }
    } else if (tm.name == "indices" && op_info(c.op).family == OpFamily::kPoolBackward) {
      v = gpu_ref::argmax_indices(c, in);   // self comes before indices in schema order
    } else if (tm.name == "total_weight") {   // nll backward: the forward's
      v = {Host::round(tm.dtype, gpu_ref::nll_total_weight(c, in))};
    } else if (tm.name == "lse" && c.op == OpId::kCrossEntropyBackward) {   // the forward's, from self
      v = gpu_ref::ce_lse(c, in);
    } else if (tm.name == "rstd" && c.op == OpId::kRmsNormBackward) {   // the forward's, from the input
      v = gpu_ref::rms_rstd(c, in);
    } else {
      v = make_input(c, tm, rng);
    }
    Host h{tm.dtype, to_memory(tm, v)};
    in_bytes.push_back(h.bytes());
    tensor_ptrs[i] = g.buffer(in_bytes.back().size());
    g.upload(tensor_ptrs[i], in_bytes.back());
    in[tm.name] = std::move(v);
  }
  std::vector<size_t> out_bytes(c.outputs.size(), 0);
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    if (!c.outputs[o].defined) continue;
    out_bytes[o] = c.outputs[o].numel() * dtype_size(c.outputs[o].dtype);
    tensor_ptrs[c.inputs.size() + o] = g.buffer(out_bytes[o]);
  }
  const std::vector<Expect> want = reference(c, in);
  // Output rounding of halves: relative, and absolute in f16's subnormal range (Rounding).
  auto rounding_of = [&](DType out, double& rel, double& floor) {
    const DType d = rounding == Rounding::kOnce ? out : k.dt;
    const double half = rounding == Rounding::kOnce ? 0.5 : 1.0;
    rel = half * (d == DType::kF16 ? std::ldexp(1.0, -10) : d == DType::kBF16 ? std::ldexp(1.0, -7) : 0);
    floor = d == DType::kF16 ? half * std::ldexp(1.0, -24) : 1e-30;
  };

  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const Candidate& cand = cands[ci];
    const std::string where = describe(k) + " " + cand.id();
    if (!bins[ci].is_ok() && bins[ci].status().code() == Code::kUnsupported) {   // not emulatable
      ++counts.unsupported;
      continue;
    }
    ASSERT_TRUE(bins[ci].is_ok()) << where << ": " << bins[ci].status().to_string();
    auto spec = parse_launch_spec(cand.launch);
    ASSERT_TRUE(spec.is_ok()) << where;
    auto rs = resolve(spec.value(), bind);
    ASSERT_TRUE(rs.is_ok()) << where << ": " << rs.status().to_string();
    auto l = g.b->load(bins[ci]->binary, rs.value());
    ASSERT_TRUE(l.is_ok()) << where << ": " << l.status().to_string();
    std::vector<void*> ptrs;
    for (CUdeviceptr p : tensor_ptrs) ptrs.push_back(reinterpret_cast<void*>(p));
    std::vector<CUdeviceptr> scratch;
    for (int64_t bytes : rs->scratch_bytes) {
      scratch.push_back(g.buffer(bytes));
      ptrs.push_back(reinterpret_cast<void*>(scratch.back()));
    }
    std::vector<std::string> first(c.outputs.size());
    // A candidate declared not repeatable (float atomics: Candidate::repeatable) has its second
    // run checked against the reference again instead of against the first run's bytes.
    const bool repeatable = cand.repeatable;
    for (int rep = 0; rep < 2; ++rep) {
      // Poison outputs and scratch (0xff bytes: NaN in every float type).
      for (size_t o = 0; o < c.outputs.size(); ++o) {
        if (!out_bytes[o]) continue;
        g.fill(tensor_ptrs[c.inputs.size() + o], 0xff, out_bytes[o]);
      }
      for (size_t s = 0; s < scratch.size(); ++s)
        g.fill(scratch[s], 0xff, rs->scratch_bytes[s]);
      ExecContext ctx;
      ctx.stream = g.stream;
      Status st = l.value()->run(ptrs.data(), ctx);
      ASSERT_TRUE(st.is_ok()) << where << ": " << st.to_string();
      g.finish();
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << where;
      for (size_t o = 0; o < c.outputs.size(); ++o) {
        if (!out_bytes[o]) continue;
        std::string got = g.download(tensor_ptrs[c.inputs.size() + o], out_bytes[o]);
        if (rep == 1 && repeatable) {
          EXPECT_TRUE(got == first[o]) << where << ": out" << o << " differs between two runs";
          continue;
        }
        first[o] = got;
        const Vec out = to_memory(c.outputs[o], Host::decode(c.outputs[o].dtype, got), true);
        const Expect& e = want[o];
        double out_ulp, out_floor;
        rounding_of(c.outputs[o].dtype, out_ulp, out_floor);
        ASSERT_EQ(out.size(), e.ref.size()) << where;
        int64_t bad = 0;
        double worst = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          // A finite result beyond the output dtype's range is that dtype's infinity (fp16: 65504).
          const double r = std::isfinite(e.ref[i]) && std::isinf(Host::round(c.outputs[o].dtype, e.ref[i]))
                               ? Host::round(c.outputs[o].dtype, e.ref[i]) : e.ref[i];
          const double y = out[i];
          bool ok;
          if (std::isnan(r)) ok = std::isnan(y);
          else if (std::isinf(r)) ok = y == r;
          else {
            // Integer outputs (pooling's indices) are exact: no output rounding allowance.
            const bool exact = c.outputs[o].dtype == DType::kI64;
            const double tol = rtol * e.scale[i] + (exact ? 0 : out_ulp * std::fabs(r) + out_floor);
            ok = std::fabs(y - r) <= tol;
            if (std::isfinite(y)) worst = std::max(worst, std::fabs(y - r) / tol);
          }
          if (!ok && bad++ < 5)
            ADD_FAILURE() << where << ": out" << o << "[" << i << "] = " << y << ", want " << r << " (scale " << e.scale[i] << ")";
        }
        EXPECT_EQ(bad, 0) << where << ": out" << o << " has " << bad << " wrong of " << out.size();
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Inputs are untouched.
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (!c.inputs[i].defined) continue;
      EXPECT_TRUE(g.download(tensor_ptrs[i], in_bytes[i].size()) == in_bytes[i])
          << where << ": input " << c.inputs[i].name << " changed";
    }
    ++counts.candidates;
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace

void Gpu::SetUp() {
  // KC_GPU_TEST_MAX_NUMEL skips big shapes (for runs under compute-sanitizer).
  if (const char* mx = std::getenv("KC_GPU_TEST_MAX_NUMEL")) max_numel = std::atoll(mx);
  Status avail = cuda_available(0);
  if (!avail.is_ok()) GTEST_SKIP() << "no usable CUDA device: " << avail.to_string();
  auto be = cuda_backend(0);
  ASSERT_TRUE(be.is_ok()) << be.status().to_string();
  acquire(be.value());
}

void Gpu::upload(CUdeviceptr p, const std::string& bytes) {
  ASSERT_EQ(d->cuMemcpyHtoD(p, bytes.data(), bytes.size()), CUDA_SUCCESS);
}

void Gpu::fill(CUdeviceptr p, unsigned char byte, size_t bytes) {
  ASSERT_EQ(d->cuMemsetD8Async(p, byte, bytes, stream), CUDA_SUCCESS);
}

void Gpu::finish() { ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS); }

std::string Gpu::download(CUdeviceptr p, size_t bytes) {
  std::string h(bytes, '\0');
  if (bytes) {
    EXPECT_EQ(d->cuMemcpyDtoH(h.data(), p, bytes), CUDA_SUCCESS);
  }
  return h;
}

void Emulated::SetUp() {
  b = &emu_backend();
  // One host thread runs every CUDA thread: small shapes, and the settings a case names (its
  // defaults and extras) without the random samples, keep the CPU-only CI fast.
  // KC_EMU_MAX_NUMEL and KC_EMU_SAMPLED=1 widen it for a deeper run by hand.
  const char* mx = std::getenv("KC_EMU_MAX_NUMEL");
  const char* smp = std::getenv("KC_EMU_SAMPLED");
  max_numel = mx ? std::atoll(mx) : 1 << 14;
  sampled = smp && std::string(smp) == "1";
}

void Emulated::TearDown() {
  for (void* p : host) std::free(p);
}

// 256-byte aligned, like cuMemAlloc's, so the kernels' vector loads see the alignment they would.
CUdeviceptr Emulated::buffer(size_t bytes) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 16) + 255) / 256 * 256);
  host.push_back(p);
  return reinterpret_cast<CUdeviceptr>(p);
}

void Emulated::upload(CUdeviceptr p, const std::string& bytes) { std::memcpy(reinterpret_cast<void*>(p), bytes.data(), bytes.size()); }

void Emulated::fill(CUdeviceptr p, unsigned char byte, size_t bytes) { std::memset(reinterpret_cast<void*>(p), byte, bytes); }

std::string Emulated::download(CUdeviceptr p, size_t bytes) { return std::string(reinterpret_cast<const char*>(p), bytes); }

std::string describe(const Case& k) {
  std::string s = op_info(k.op).name;
  s += "[";
  for (size_t i = 0; i < k.sizes.size(); ++i) s += (i ? "," : "") + std::to_string(k.sizes[i]);
  return s + "]" + dtype_name(k.dt) + (k.args.empty() ? "" : k.args.dump());
}

int run_all(Gpu& g, const std::vector<Case>& cs, double rtol, Rounding rounding) {
  Counts n;
  for (const Case& k : cs) {
    run_case(g, k, n, rtol, rounding);
    if (::testing::Test::HasFatalFailure()) return n.candidates;
  }
  std::printf("%d candidates checked (%d settings kUnsupported)\n", n.candidates, n.unsupported);
  return n.candidates;
}

void time_candidates(Gpu& g, const OpCall& c, const std::vector<Knobs>& knobs, double budget_ms, std::vector<Timed>& out) {
  const Template* tp = template_for(c);
  ASSERT_NE(tp, nullptr) << c.key;
  // Under a profiler, only the calls whose key holds this text (e.g. an op's name and sizes).
  if (const char* m = std::getenv("KC_TIMING_MATCH"); m && call_key(c).find(m) == std::string::npos) return;
  const Binding bind = c.binding();
  std::vector<void*> ptrs;
  for (const auto& tm : bind.tensors) {
    CUdeviceptr p = 0;
    if (tm.defined) {
      p = g.alloc(tm.numel() * dtype_size(tm.dtype));
      ASSERT_EQ(g.d->cuMemsetD8Async(p, 0, tm.numel() * dtype_size(tm.dtype), g.stream), CUDA_SUCCESS);
    }
    ptrs.push_back(reinterpret_cast<void*>(p));
  }
  for (const Knobs& kn : knobs) {
    auto r = tp->render(c, kn);
    if (!r.is_ok()) continue;
    auto bin = g.b->compile(r->source);
    ASSERT_TRUE(bin.is_ok()) << bin.status().to_string();
    auto rs = resolve(parse_launch_spec(r->launch).value(), bind);
    ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
    auto l = g.b->load(bin->binary, rs.value());
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    std::vector<void*> all = ptrs;
    for (int64_t n : rs->scratch_bytes) all.push_back(reinterpret_cast<void*>(g.alloc(n)));
    ExecContext ctx;
    ctx.stream = g.stream;
    TimingOptions o;
    o.budget_ms = budget_ms;
    if (std::getenv("KC_TIMING_ONCE")) {   // under a profiler (ncu): two launches a setting, not hundreds
      o.warmup = 1;
      o.min_reps = o.max_reps = 1;
    }
    auto tm = time_cuda(g.stream, [&] { return l.value()->run(all.data(), ctx); }, o);
    ASSERT_TRUE(tm.is_ok()) << tm.status().to_string();
    out.push_back({kn, r->id(), tm->median_ms});
  }
}

}  // namespace kc::evolve::gpu_run
