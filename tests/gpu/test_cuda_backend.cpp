// CUDA backend on a real GPU: compile, load into the primary context, launch on streams, check
// results; launch failures as statuses; the timing routine in event and graph modes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "runtime/cuda_api.h"
#include "runtime/cuda_backend.h"
#include "runtime/timing.h"
#include "tests/gpu/gpu_fixture.h"

namespace kc {
namespace {

using nlohmann::json;

const char* kSource = R"J(
extern "C" __global__ void kc_axpb(float* out, const float* x, float a, double b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + (float)b;
}
// Block-wide sum through dynamic shared memory (one partial per block into scratch), then a
// second launch that adds the partials: two launches in order with a scratch buffer.
extern "C" __global__ void kc_partial_sum(float* partial, const float* x, long long n) {
  extern __shared__ float sh[];
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  sh[threadIdx.x] = i < n ? x[i] : 0.f;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}
extern "C" __global__ void kc_finish_sum(float* out, const float* partial, int parts) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < parts; ++i) s += partial[i];
    out[0] = s;
  }
}
// Uses 64 KiB of dynamic shared memory: needs the > 48 KiB opt-in at load.
extern "C" __global__ void kc_big_smem(float* out, int words) {
  extern __shared__ float sh[];
  for (int i = threadIdx.x; i < words; i += blockDim.x) sh[i] = (float)i;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = sh[words - 1];
}
extern "C" __global__ void __launch_bounds__(128) kc_bounded(float* out) { out[threadIdx.x] = 1.f; }
)J";

struct Gpu : GpuFixture {
  CompileOutput bin;

  void SetUp() override {
    auto be = cuda_backend(0);
    if (!be.is_ok()) GTEST_SKIP() << "no usable CUDA device: " << be.status().to_string();
    acquire(be.value());
    if (HasFatalFailure()) return;
    auto c = b->compile(kSource);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    bin = c.value();
  }

  CUdeviceptr upload(const std::vector<float>& h) {
    CUdeviceptr p = alloc(h.size() * sizeof(float), sizeof(float));
    if (!h.empty()) {
      EXPECT_EQ(d->cuMemcpyHtoD(p, h.data(), h.size() * sizeof(float)), CUDA_SUCCESS);
    }
    return p;
  }
  std::vector<float> download(CUdeviceptr p, size_t n) {
    std::vector<float> h(n);
    EXPECT_EQ(d->cuMemcpyDtoH(h.data(), p, n * sizeof(float)), CUDA_SUCCESS);
    return h;
  }
  Result<std::unique_ptr<Launcher>> load(const json& spec, const Binding& bind) {
    auto s = parse_launch_spec(spec);
    if (!s.is_ok()) return s.status();
    auto r = resolve(s.value(), bind);
    if (!r.is_ok()) return r.status();
    return b->load(bin.binary, r.value());
  }
};

TensorMeta f32(const std::string& name, int64_t n) {
  TensorMeta t;
  t.name = name;
  t.sizes = {n};
  t.strides = {1};
  return t;
}

json axpb_spec(const std::string& block = "256") {
  return {{"launches",
           {{{"entry", "kc_axpb"}, {"grid", {"ceil_div(numel(self), " + block + ")"}}, {"block", {block}},
             {"args", {"ptr:out0", "ptr:self", "f32:alpha", "f64:0.25", "i32:numel(self)"}}}}}};
}

TEST_F(Gpu, TargetIdNamesArchDriverAndNvrtc) {
  std::string id = b->target_id();
  EXPECT_EQ(id.rfind("cuda-sm_", 0), 0u) << id;
  EXPECT_NE(id.find("+drv-"), std::string::npos) << id;
  EXPECT_NE(id.find("+nvrtc-"), std::string::npos) << id;
  std::printf("target_id %s, compile %.1f ms, %zu B CUBIN\n", id.c_str(), bin.millis, bin.binary.size());
}

TEST_F(Gpu, LaunchesOnTheDefaultAndANonDefaultStream) {
  const int n = 100003;
  Binding bind;
  bind.tensors = {f32("self", n), f32("out0", n)};
  bind.scalars.push_back({"alpha", ScalarValue{-1.5}});
  auto l = load(axpb_spec(), bind);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = std::sin(i * 0.01f) * 100;
  CUdeviceptr dx = upload(x), dout = upload(std::vector<float>(n, NAN));
  void* ptrs[] = {reinterpret_cast<void*>(dx), reinterpret_cast<void*>(dout)};
  for (CUstream s : {static_cast<CUstream>(nullptr), stream}) {
    ExecContext ctx;
    ctx.stream = s;
    Status st = l.value()->run(ptrs, ctx);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(d->cuCtxSynchronize(), CUDA_SUCCESS);
    auto out = download(dout, n);
    // nvcc/NVRTC contract a * x + b into one FMA; the reference does the same.
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], std::fmaf(-1.5f, x[i], 0.25f)) << i;
  }
}

TEST_F(Gpu, RunRestoresTheCallersContextState) {
  Binding bind;
  bind.tensors = {f32("self", 10), f32("out0", 10)};
  bind.scalars.push_back({"alpha", ScalarValue{2.0}});
  auto l = load(axpb_spec(), bind);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  CUdeviceptr dx = upload(std::vector<float>(10, 1.f)), dout = upload(std::vector<float>(10, 0.f));
  void* ptrs[] = {reinterpret_cast<void*>(dx), reinterpret_cast<void*>(dout)};
  ASSERT_EQ(d->cuCtxSetCurrent(nullptr), CUDA_SUCCESS);   // a thread with no current context
  ExecContext ctx;
  ctx.stream = stream;
  ASSERT_TRUE(l.value()->run(ptrs, ctx).is_ok());
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  ASSERT_EQ(d->cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  EXPECT_EQ(cur, nullptr);   // pushed and popped, not left behind
  ASSERT_EQ(d->cuCtxSetCurrent(primary), CUDA_SUCCESS);
  ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_FLOAT_EQ(download(dout, 10)[9], 2.25f);
}

TEST_F(Gpu, TwoLaunchesWithScratchAndDynamicSharedMemory) {
  const int n = 1 << 20;
  Binding bind;
  bind.tensors = {f32("self", n), f32("out0", 1)};
  json spec = json::parse(R"J({"launches": [
      {"entry": "kc_partial_sum", "grid": ["ceil_div(numel(self), 512)"], "block": [512], "smem": 2048,
       "args": ["ptr:partial", "ptr:self", "i64:numel(self)"]},
      {"entry": "kc_finish_sum", "grid": [1], "block": [32], "args": ["ptr:out0", "ptr:partial", "i32:ceil_div(numel(self), 512)"]}],
    "scratch": [{"name": "partial", "bytes": "ceil_div(numel(self), 512) * 4"}]})J");
  auto s = parse_launch_spec(spec);
  ASSERT_TRUE(s.is_ok());
  auto rs = resolve(s.value(), bind);
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  auto l = b->load(bin.binary, rs.value());
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  CUdeviceptr dx = upload(std::vector<float>(n, 0.5f)), dout = upload({0.f});
  CUdeviceptr scratch = upload(std::vector<float>(rs->scratch_bytes[0] / 4, NAN));
  void* ptrs[] = {reinterpret_cast<void*>(dx), reinterpret_cast<void*>(dout), reinterpret_cast<void*>(scratch)};
  ExecContext ctx;
  ctx.stream = stream;
  ASSERT_TRUE(l.value()->run(ptrs, ctx).is_ok());
  ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_FLOAT_EQ(download(dout, 1)[0], n * 0.5f);
}

TEST_F(Gpu, MoreThan48KiBOfSharedMemoryIsOptedInAtLoad) {
  Binding bind;
  bind.tensors = {f32("out0", 1)};
  json spec = {{"launches", {{{"entry", "kc_big_smem"}, {"grid", {1}}, {"block", {256}}, {"smem", 65536},
                              {"args", {"ptr:out0", "i32:16384"}}}}}};
  auto l = load(spec, bind);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  CUdeviceptr dout = upload({0.f});
  void* ptrs[] = {reinterpret_cast<void*>(dout)};
  ExecContext ctx;
  ctx.stream = stream;
  Status st = l.value()->run(ptrs, ctx);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(download(dout, 1)[0], 16383.f);
  spec["launches"][0]["smem"] = 1 << 20;   // more than any GPU has
  auto too_much = load(spec, bind);
  ASSERT_FALSE(too_much.is_ok());
  EXPECT_EQ(too_much.status().code(), Code::kLaunchError);
}

TEST_F(Gpu, BadLaunchesAreStatusesNeverAborts) {
  Binding bind;
  bind.tensors = {f32("self", 4096), f32("out0", 4096)};
  bind.scalars.push_back({"alpha", ScalarValue{1.0}});
  auto big = load(axpb_spec("2048"), bind);   // 2048 threads per block
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(big.status().code(), Code::kLaunchError);
  EXPECT_NE(big.status().message().find("kc_axpb"), std::string::npos) << big.status().message();
  // __launch_bounds__(128) with 256 threads: the kernel's own limit is checked too.
  json bounded = {{"launches", {{{"entry", "kc_bounded"}, {"grid", {1}}, {"block", {256}}, {"args", {"ptr:out0"}}}}}};
  auto lb = load(bounded, bind);
  ASSERT_FALSE(lb.is_ok());
  EXPECT_NE(lb.status().message().find("128"), std::string::npos) << lb.status().message();
  // A grid the driver refuses is reported by run() with entry, grid and block.
  json tall = axpb_spec();
  tall["launches"][0]["grid"] = {1, 70000, 1};
  auto lt = load(tall, bind);
  ASSERT_TRUE(lt.is_ok()) << lt.status().to_string();
  CUdeviceptr dx = upload(std::vector<float>(4096, 1.f)), dout = upload(std::vector<float>(4096, 0.f));
  void* ptrs[] = {reinterpret_cast<void*>(dx), reinterpret_cast<void*>(dout)};
  ExecContext ctx;
  ctx.stream = stream;
  Status st = lt.value()->run(ptrs, ctx);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), Code::kLaunchError);
  EXPECT_NE(st.message().find("kc_axpb"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(1, 70000, 1)"), std::string::npos) << st.message();
  std::printf("reported: %s\n", st.to_string().c_str());
  // The context is still healthy afterwards.
  auto ok = load(axpb_spec(), bind);
  ASSERT_TRUE(ok.is_ok());
  ASSERT_TRUE(ok.value()->run(ptrs, ctx).is_ok());
  ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
  // Missing entries and damaged CUBINs fail at load.
  json missing = {{"launches", {{{"entry", "kc_nope"}, {"grid", {1}}, {"block", {1}}, {"args", json::array()}}}}};
  auto lm = load(missing, bind);
  ASSERT_FALSE(lm.is_ok());
  EXPECT_EQ(lm.status().code(), Code::kLaunchError);
  auto s = parse_launch_spec(axpb_spec());
  auto rs = resolve(s.value(), bind);
  auto trunc = b->load(bin.binary.substr(0, bin.binary.size() / 2), rs.value());
  ASSERT_FALSE(trunc.is_ok());
  EXPECT_EQ(trunc.status().code(), Code::kLaunchError);
}

TEST_F(Gpu, TimingInEventAndGraphModes) {
  const int n = 1 << 24;   // 64 MiB in, 64 MiB out: bandwidth bound
  Binding bind;
  bind.tensors = {f32("self", n), f32("out0", n)};
  bind.scalars.push_back({"alpha", ScalarValue{3.0}});
  auto l = load(axpb_spec(), bind);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  CUdeviceptr dx = 0, dout = 0;
  ASSERT_EQ(d->cuMemAlloc(&dx, n * sizeof(float)), CUDA_SUCCESS);
  allocs.push_back(dx);
  ASSERT_EQ(d->cuMemAlloc(&dout, n * sizeof(float)), CUDA_SUCCESS);
  allocs.push_back(dout);
  void* ptrs[] = {reinterpret_cast<void*>(dx), reinterpret_cast<void*>(dout)};
  ExecContext ctx;
  ctx.stream = stream;
  auto call = [&] { return l.value()->run(ptrs, ctx); };
  TimingOptions o;
  o.budget_ms = 50;
  auto t = time_cuda(stream, call, o);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_GE(t->reps, o.min_reps);
  EXPECT_TRUE(t->cache_flushed);
  EXPECT_GT(t->median_ms, 0);
  EXPECT_LE(t->p10_ms, t->median_ms);
  EXPECT_LE(t->median_ms, t->p90_ms);
  std::printf("events: median %.4f ms (p10 %.4f p90 %.4f, %d reps) = %.0f GB/s\n", t->median_ms, t->p10_ms,
              t->p90_ms, t->reps, 2.0 * n * 4 / (t->median_ms * 1e6));

  // A launch-bound call (32 elements) replayed from a graph.
  Binding tiny;
  tiny.tensors = {f32("self", 32), f32("out0", 32)};
  tiny.scalars.push_back({"alpha", ScalarValue{3.0}});
  auto lt = load(axpb_spec(), tiny);
  ASSERT_TRUE(lt.is_ok());
  auto tiny_call = [&] { return lt.value()->run(ptrs, ctx); };
  o.graph = true;
  auto g = time_cuda(stream, tiny_call, o);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_TRUE(g->graph);
  EXPECT_GE(g->calls_per_rep, 10);
  EXPECT_GT(g->median_ms, 0);
  o.graph = false;
  auto e = time_cuda(stream, tiny_call, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  std::printf("tiny: graph %.5f ms/call (%d calls per replay) vs events %.5f ms/call\n", g->median_ms,
              g->calls_per_rep, e->median_ms);

  // Errors: graph mode on the legacy stream, and a failing callable, come back as statuses.
  o.graph = true;
  auto legacy = time_cuda(nullptr, tiny_call, o);
  ASSERT_FALSE(legacy.is_ok());
  EXPECT_EQ(legacy.status().code(), Code::kInvalid);
  // Fails inside the capture (after the 3 warm-up calls): the capture must still be ended.
  int calls = 0;
  auto fail_later = [&] { return ++calls > 5 ? Status::error(Code::kRejected, "nope") : tiny_call(); };
  auto failing = time_cuda(stream, fail_later, o);
  ASSERT_FALSE(failing.is_ok());
  EXPECT_EQ(failing.status().code(), Code::kRejected);
  // The stream is not left capturing: a plain launch still works.
  ASSERT_TRUE(tiny_call().is_ok());
  ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
}

}  // namespace
}  // namespace kc
