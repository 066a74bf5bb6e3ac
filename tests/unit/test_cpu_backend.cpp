// CPU backend end to end: compile real kernels with the host compiler, load, run serially and
// threaded, compare with references; compile errors and missing entries come back as statuses.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "runtime/cpu_backend.h"
#include "runtime/timing.h"

namespace kc {
namespace {

using nlohmann::json;

TensorMeta f32_tensor(const std::string& name, std::vector<int64_t> sizes) {
  TensorMeta t;
  t.name = name;
  t.sizes = sizes;
  t.strides.assign(sizes.size(), 1);
  for (int i = static_cast<int>(sizes.size()) - 2; i >= 0; --i) t.strides[i] = t.strides[i + 1] * sizes[i + 1];
  return t;
}

// A parallel_for over 4 std::threads, as at::parallel_for would split the range.
void threaded_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t parts = 4, chunk = (n + parts - 1) / parts;
  std::vector<std::thread> ts;
  for (int64_t b = 0; b < n; b += chunk) ts.emplace_back(fn, b, std::min(n, b + chunk));
  for (auto& t : ts) t.join();
}

std::unique_ptr<Launcher> build(const std::string& src, const json& spec_json, const Binding& b) {
  auto out = cpu_backend().compile(src);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  if (!out.is_ok()) return nullptr;
  EXPECT_GT(out->millis, 0);
  auto spec = parse_launch_spec(spec_json);
  EXPECT_TRUE(spec.is_ok()) << spec.status().to_string();
  auto rs = resolve(spec.value(), b);
  EXPECT_TRUE(rs.is_ok()) << rs.status().to_string();
  if (!rs.is_ok()) return nullptr;
  auto l = cpu_backend().load(out->binary, rs.value());
  EXPECT_TRUE(l.is_ok()) << l.status().to_string();
  return l.is_ok() ? std::move(l.value()) : nullptr;
}

const char* kLeakyRelu = R"J(
extern "C" void kc_leaky_relu(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* in = KC_ARG(const float*, args, 1);
  int64_t n = KC_ARG(int64_t, args, 2);
  float slope = KC_ARG(float, args, 3);
  int32_t bs = KC_ARG(int32_t, args, 4);
  for (int64_t b = ctx->begin; b < ctx->end; ++b) {
    int64_t lo = b * bs, hi = lo + bs < n ? lo + bs : n;
    for (int64_t i = lo; i < hi; ++i) out[i] = in[i] > 0 ? in[i] : in[i] * slope;
  }
}
)J";

TEST(CpuBackend, LeakyReluSerialAndThreaded) {
  Binding b;
  b.tensors = {f32_tensor("self", {1000, 3}), f32_tensor("out0", {1000, 3})};
  b.scalars.push_back({"negative_slope", ScalarValue{0.125}});
  json spec = {{"launches",
                {{{"entry", "kc_leaky_relu"},
                  {"grid", {"ceil_div(numel(self), 256)"}},
                  {"block", {256}},
                  {"args", {"ptr:out0", "ptr:self", "i64:numel(self)", "f32:negative_slope", "i32:256"}}}}}};
  auto l = build(kLeakyRelu, spec, b);
  ASSERT_TRUE(l);
  std::vector<float> in(3000), out(3000, NAN);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 10);
  for (auto& x : in) x = nd(rng);
  void* ptrs[] = {in.data(), out.data()};  // binding order: self, out0
  for (int threaded = 0; threaded < 2; ++threaded) {
    std::fill(out.begin(), out.end(), NAN);
    ExecContext ctx;
    if (threaded) ctx.parallel_for = threaded_for;
    Status s = l->run(ptrs, ctx);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i], in[i] > 0 ? in[i] : in[i] * 0.125f) << "i=" << i << " threaded=" << threaded;
  }
}

// Two launches in order with a scratch buffer between them: row maxima, then the softmax.
const char* kSoftmax = R"J(
extern "C" void kc_rowmax(const kc_cpu_ctx* ctx, void* const* args) {
  float* mx = KC_ARG(float*, args, 0);
  const float* in = KC_ARG(const float*, args, 1);
  int64_t cols = KC_ARG(int64_t, args, 2);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    float m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, in[r * cols + c]);
    mx[r] = m;
  }
}
extern "C" void kc_softmax(const kc_cpu_ctx* ctx, void* const* args) {
  float* out = KC_ARG(float*, args, 0);
  const float* in = KC_ARG(const float*, args, 1);
  const float* mx = KC_ARG(const float*, args, 2);
  int64_t cols = KC_ARG(int64_t, args, 3);
  for (int64_t r = ctx->begin; r < ctx->end; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += out[r * cols + c] = expf(in[r * cols + c] - mx[r]);
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = (float)(out[r * cols + c] / sum);
  }
}
)J";

TEST(CpuBackend, TwoLaunchSoftmaxWithScratch) {
  const int64_t rows = 37, cols = 129;
  Binding b;
  b.tensors = {f32_tensor("self", {rows, cols}), f32_tensor("out0", {rows, cols})};
  json spec = json::parse(R"J({"version": 1,
    "launches": [{"entry": "kc_rowmax", "grid": ["size(self,0)"], "block": [1],
                  "args": ["ptr:rowmax", "ptr:self", "i64:size(self,-1)"]},
                 {"entry": "kc_softmax", "grid": ["size(self,0)"], "block": [1],
                  "args": ["ptr:out0", "ptr:self", "ptr:rowmax", "i64:size(self,-1)"]}],
    "scratch": [{"name": "rowmax", "bytes": "size(self,0) * 4"}]})J");
  auto l = build(kSoftmax, spec, b);
  ASSERT_TRUE(l);
  std::vector<float> in(rows * cols), out(rows * cols, NAN), scratch(rows);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> ud(-30, 30);
  for (auto& x : in) x = ud(rng) + 1000;   // large mean: a missing max subtraction overflows
  void* ptrs[] = {in.data(), out.data(), scratch.data()};
  for (int threaded = 0; threaded < 2; ++threaded) {
    ExecContext ctx;
    if (threaded) ctx.parallel_for = threaded_for;
    ASSERT_TRUE(l->run(ptrs, ctx).is_ok());
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, sum = 0;
      for (int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(in[r * cols + c]));
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(in[r * cols + c] - m);
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_NEAR(out[r * cols + c], std::exp(in[r * cols + c] - m) / sum, 1e-6) << r << "," << c;
    }
  }
}

TEST(CpuBackend, TimingTheCpuKernel) {
  const int64_t n = 1 << 16;
  Binding b;
  b.tensors = {f32_tensor("self", {n}), f32_tensor("out0", {n})};
  b.scalars.push_back({"negative_slope", ScalarValue{0.5}});
  json spec = {{"launches",
                {{{"entry", "kc_leaky_relu"},
                  {"grid", {"ceil_div(numel(self), 4096)"}},
                  {"block", {1}},
                  {"args", {"ptr:out0", "ptr:self", "i64:numel(self)", "f32:negative_slope", "i32:4096"}}}}}};
  auto l = build(kLeakyRelu, spec, b);
  ASSERT_TRUE(l);
  std::vector<float> in(n, -1.f), out(n);
  void* ptrs[] = {in.data(), out.data()};
  TimingOptions o;
  o.budget_ms = 20;
  o.min_reps = 5;
  auto t = time_cpu([&] { return l->run(ptrs, ExecContext{}); }, o);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_GE(t->reps, 5);
  EXPECT_GT(t->median_ms, 0);
  EXPECT_LE(t->p10_ms, t->median_ms);
  EXPECT_LE(t->median_ms, t->p90_ms);
  EXPECT_TRUE(t->cache_flushed);
  EXPECT_EQ(out[n - 1], -0.5f);
  auto bad = time_cpu([] { return Status::error(Code::kRejected, "no"); }, o);
  EXPECT_EQ(bad.status().code(), Code::kRejected);
  Timing s = summarize({4, 1, 3, 2, 100});
  EXPECT_EQ(s.median_ms, 3);
  EXPECT_EQ(s.min_ms, 1);
  EXPECT_EQ(s.mad_ms, 1);
  EXPECT_EQ(s.reps, 5);
}

TEST(CpuBackend, CompileErrorCarriesTheCompilerMessage) {
  auto out = cpu_backend().compile("extern \"C\" void k(const kc_cpu_ctx* ctx, void* const* args) { int x = ; }\n");
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), Code::kCompileError);
  EXPECT_NE(out.status().message().find("error"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("kernel.cpp:1"), std::string::npos) << out.status().message();
}

TEST(CpuBackend, UndefinedSymbolsFailAtCompileTime) {
  auto out = cpu_backend().compile("extern \"C\" void nowhere();\nextern \"C\" void k(const kc_cpu_ctx*, void* const*) { nowhere(); }\n");
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), Code::kCompileError);
  EXPECT_NE(out.status().message().find("nowhere"), std::string::npos) << out.status().message();
}

TEST(CpuBackend, MissingEntryIsALaunchError) {
  auto out = cpu_backend().compile(kLeakyRelu);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  Binding b;
  b.tensors = {f32_tensor("self", {4})};
  auto spec = parse_launch_spec(json::parse(R"J({"launches": [{"entry": "kc_nope", "grid": [1], "block": [1], "args": []}]})J"));
  ASSERT_TRUE(spec.is_ok());
  auto rs = resolve(spec.value(), b);
  ASSERT_TRUE(rs.is_ok());
  auto l = cpu_backend().load(out->binary, rs.value());
  ASSERT_FALSE(l.is_ok());
  EXPECT_EQ(l.status().code(), Code::kLaunchError);
  EXPECT_NE(l.status().message().find("kc_nope"), std::string::npos);
  auto bad = cpu_backend().load("not a shared object", rs.value());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), Code::kLaunchError);
  std::string truncated = out->binary.substr(0, 200);
  auto trunc = cpu_backend().load(truncated, rs.value());
  ASSERT_FALSE(trunc.is_ok());
  EXPECT_EQ(trunc.status().code(), Code::kLaunchError);
}

// Several objects with the same entry name loaded at once (and one unloaded in between) must
// each run their own code: the loader must never hand back a stale object.
TEST(CpuBackend, ManyLoadedKernelsStayDistinct) {
  auto kernel = [](int v) {
    return "extern \"C\" void k(const kc_cpu_ctx*, void* const* args) { *KC_ARG(int*, args, 0) = " +
           std::to_string(v) + "; }\n";
  };
  Binding b;
  TensorMeta t = f32_tensor("x", {1});
  t.dtype = DType::kI32;
  b.tensors = {t};
  auto spec = parse_launch_spec(json::parse(R"J({"launches": [{"entry": "k", "grid": [1], "block": [1], "args": ["ptr:x"]}]})J"));
  ASSERT_TRUE(spec.is_ok());
  auto rs = resolve(spec.value(), b);
  ASSERT_TRUE(rs.is_ok());
  std::vector<std::unique_ptr<Launcher>> ls;
  for (int v = 1; v <= 4; ++v) {
    if (v == 3) ls.erase(ls.begin());   // unload the first before loading the third
    auto out = cpu_backend().compile(kernel(v));
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    auto l = cpu_backend().load(out->binary, rs.value());
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    ls.push_back(std::move(l.value()));
  }
  std::vector<int> expect = {2, 3, 4};
  for (size_t i = 0; i < ls.size(); ++i) {
    int x = 0;
    void* ptrs[] = {&x};
    ASSERT_TRUE(ls[i]->run(ptrs, ExecContext{}).is_ok());
    EXPECT_EQ(x, expect[i]);
  }
}

TEST(CpuBackend, TargetIdNamesIsaAndCompiler) {
  std::string id = cpu_backend().target_id();
  EXPECT_EQ(id.rfind("cpu-", 0), 0u) << id;
  EXPECT_TRUE(id.find("+gcc-") != std::string::npos || id.find("+clang-") != std::string::npos) << id;
  // The build's ABI: records from builds with start files (which the binary check refuses) never match.
  EXPECT_EQ(id.substr(id.size() - 5), "+abi2") << id;
  EXPECT_STREQ(cpu_backend().name(), "cpu");
}

TEST(Backend, KindsHaveOneNameEachAndTheCpuIsChosenForItsKind) {
  for (BackendKind k : {BackendKind::kCpu, BackendKind::kCuda}) EXPECT_EQ(backend_from_name(backend_name(k)), k);
  for (const char* bad : {"", "CPU", "hip", "cuda0"}) EXPECT_FALSE(backend_from_name(bad)) << bad;
  auto be = backend_for(BackendKind::kCpu, 0);
  ASSERT_TRUE(be.is_ok());
  EXPECT_EQ(be.value(), &cpu_backend());
  EXPECT_EQ(be.value()->kind(), BackendKind::kCpu);
}

TEST(CpuBackend, PreludeIsKcCpuH) {
  std::ifstream f(std::string(KC_SOURCE_DIR) + "/runtime/kc_cpu.h");
  ASSERT_TRUE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), cpu_kernel_prelude());
}

}  // namespace
}  // namespace kc
