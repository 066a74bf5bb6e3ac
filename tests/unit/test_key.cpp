// Cache keys: the canonical string for concrete calls, and that everything a kernel depends on
// changes the key.
#include <cmath>
#include <limits>
#include <set>

#include <gtest/gtest.h>

#include "kernel_cache/key.h"

namespace kc {
namespace {

const std::string kTarget = "cpu-x86_64+gcc-12.2.0";

TensorMeta meta(DType dt, std::vector<int64_t> sizes, std::vector<int64_t> strides, int align = 16) {
  TensorMeta t;
  t.name = "self";
  t.dtype = dt;
  t.sizes = std::move(sizes);
  t.strides = std::move(strides);
  t.align = align;
  return t;
}

TEST(Key, CanonicalLayerNorm) {
  KeyBuilder k("cuda-sm_90+drv-13000+nvrtc-13.0", "aten::native_layer_norm", "fp32");
  k.tensor("input", meta(DType::kF32, {64, 256}, {256, 1}));
  int64_t shape[] = {256};
  k.list("normalized_shape", shape, 1);
  int64_t ws[] = {256}, wst[] = {1};
  k.tensor("weight", DType::kBF16, ws, wst, 1, 8);
  k.absent("bias");
  k.d("eps", 1e-5);
  EXPECT_EQ(k.str(),
            "kc1|cuda-sm_90+drv-13000+nvrtc-13.0|aten::native_layer_norm|fp32|"
            "input=T:f32[64,256]s[256,1]a16|normalized_shape=L:[256]|"
            "weight=T:bf16[256]s[1]a8|bias=none|eps=d:1.0000000000000001e-05");
}

TEST(Key, ScalarsAndEmptyShapes) {
  KeyBuilder k(kTarget, "aten::gelu", "tf32");
  k.tensor("self", meta(DType::kF16, {}, {}));
  k.s("approximate", "tanh");
  k.i("dim", -1);
  k.i("big", std::numeric_limits<int64_t>::min());
  k.b("half_to_float", false);
  k.b("flag", true);
  k.list("empty", nullptr, 0);
  EXPECT_EQ(k.str(),
            "kc1|cpu-x86_64+gcc-12.2.0|aten::gelu|tf32|self=T:f16[]s[]a16|approximate=s:tanh|"
            "dim=i:-1|big=i:-9223372036854775808|half_to_float=b:0|flag=b:1|empty=L:[]");
}

TEST(Key, DoublesMatchPrintfAndRoundTrip) {
  const double values[] = {0.0, -0.0, 1.0, 0.1, 1e-5, 1.0 / 3.0, 6.02214076e23, 5e-324,
                           std::numeric_limits<double>::max(), 123456789.0, -2.5};
  for (double v : values) {
    KeyBuilder k(kTarget, "aten::x", "fp32");
    k.d("v", v);
    char expect[64];
    std::snprintf(expect, sizeof(expect), "%.17g", v);
    const std::string& s = k.str();
    std::string got = s.substr(s.find("v=d:") + 4);
    EXPECT_EQ(got, expect) << "value " << v;
    EXPECT_EQ(std::strtod(got.c_str(), nullptr), v);
  }
  KeyBuilder inf(kTarget, "aten::x", "fp32");
  inf.d("v", std::numeric_limits<double>::infinity());
  EXPECT_EQ(inf.str(), "kc1|cpu-x86_64+gcc-12.2.0|aten::x|fp32|v=d:inf");
}

TEST(Key, EverythingThatMattersChangesTheKey) {
  auto base = [](auto&& tweak) {
    TensorMeta t = meta(DType::kF32, {8, 32}, {32, 1}, 16);
    std::string target = kTarget, op = "aten::_softmax", policy = "fp32";
    int64_t dim = 1;
    double scale = 0.5;
    tweak(t, target, op, policy, dim, scale);
    KeyBuilder k(target, op.c_str(), policy.c_str());
    k.tensor("self", t);
    k.i("dim", dim);
    k.d("scale", scale);
    return k.take();
  };
  auto same = [](TensorMeta&, std::string&, std::string&, std::string&, int64_t&, double&) {};
  std::set<std::string> keys;
  keys.insert(base(same));
  EXPECT_EQ(base(same), *keys.begin()) << "keys must be deterministic";
  std::vector<std::string> variants = {
      base([](TensorMeta& t, auto&...) { t.dtype = DType::kF16; }),
      base([](TensorMeta& t, auto&...) { t.dtype = DType::kBF16; }),
      base([](TensorMeta& t, auto&...) { t.sizes = {32, 8}; t.strides = {8, 1}; }),
      base([](TensorMeta& t, auto&...) { t.strides = {1, 8}; }),      // transposed layout
      base([](TensorMeta& t, auto&...) { t.strides = {64, 1}; }),     // padded rows
      base([](TensorMeta& t, auto&...) { t.align = 8; }),
      base([](TensorMeta& t, auto&...) { t.align = 4; }),
      base([](TensorMeta& t, auto&...) { t.defined = false; }),
      base([](TensorMeta&, std::string& target, auto&...) { target = "cpu-aarch64+gcc-12.2.0"; }),
      base([](TensorMeta&, std::string&, std::string& op, auto&...) { op = "aten::_log_softmax"; }),
      base([](TensorMeta&, std::string&, std::string&, std::string& p, auto&...) { p = "tf32"; }),
      base([](TensorMeta&, std::string&, std::string&, std::string&, int64_t& d, double&) { d = -1; }),
      base([](TensorMeta&, std::string&, std::string&, std::string&, int64_t&, double& s) {
        s = std::nextafter(0.5, 1.0);   // one ulp apart must still be a different kernel
      }),
  };
  for (const auto& v : variants) EXPECT_TRUE(keys.insert(v).second) << "duplicate key " << v;
}

TEST(Key, ScalarKindsDoNotCollide) {
  KeyBuilder a(kTarget, "aten::x", "fp32"), b(kTarget, "aten::x", "fp32"), c(kTarget, "aten::x", "fp32");
  a.i("v", 1);
  b.d("v", 1.0);
  c.b("v", true);
  EXPECT_NE(a.str(), b.str());
  EXPECT_NE(a.str(), c.str());
  EXPECT_NE(b.str(), c.str());
}

TEST(Key, FieldsParse) {
  KeyBuilder k("cuda-sm_90+drv-13000+nvrtc-13.0", "aten::relu", "fp32");
  k.tensor("self", meta(DType::kF32, {4}, {1}));
  EXPECT_EQ(key_op(k.str()), "aten::relu");
  EXPECT_EQ(key_target(k.str()), "cuda-sm_90+drv-13000+nvrtc-13.0");
  // A key with no arguments still has its policy field.
  KeyBuilder bare(kTarget, "aten::relu", "fp32");
  EXPECT_EQ(key_op(bare.str()), "aten::relu");
  EXPECT_EQ(key_target(bare.str()), kTarget);
  EXPECT_EQ(key_op(""), "");
  EXPECT_EQ(key_op("garbage"), "");
  EXPECT_EQ(key_op("kc1|target-only"), "");
  EXPECT_EQ(key_target("xx1|a|b|c"), "");
}

}  // namespace
}  // namespace kc

namespace kc {
namespace {

// One parser of targets: the backend and, for CUDA, the architecture; nothing else is a target.
TEST(Key, TargetsParseOrAreErrors) {
  auto cpu = parse_target("cpu-x86_64-v3+gcc-12.2.0+abi2");
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_EQ(cpu->kind, BackendKind::kCpu);
  EXPECT_STREQ(backend_name(cpu->kind), "cpu");
  auto gpu = parse_target("cuda-sm_90+drv-13000+nvrtc-13.0");
  ASSERT_TRUE(gpu.is_ok());
  EXPECT_EQ(gpu->kind, BackendKind::kCuda);
  EXPECT_EQ(gpu->sm, 90);
  for (const char* bad : {"", "t", "cpu", "cuda", "cuda-sm_", "cuda-sm_x", "hip-gfx942", "CPU-x86_64"})
    EXPECT_EQ(parse_target(bad).status().code(), Code::kInvalid) << bad;
}

}  // namespace
}  // namespace kc
