// CUDA op-family templates on a real GPU: a sample of knob settings of every family at several
// shapes (odd sizes, rows not a multiple of 32, the 4M-element layer norm row) against fp64
// references computed here, with outputs and scratch poisoned (NaN) before every launch, inputs
// checked unchanged, and a second run that must agree bit for bit. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/proposer.h"
#include "runtime/cuda_api.h"
#include "runtime/cuda_backend.h"
#include "runtime/launch_spec.h"
#include "runtime/timing.h"

namespace kc::evolve {
namespace {

using nlohmann::json;
using Vec = std::vector<double>;

// ---- host fp16 / bf16 (round to nearest even) ----------------------------------------------------

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);   // rounds to inf
  if (a < 0x33000001u) return static_cast<uint16_t>(sign);               // below half the smallest subnormal
  int e = static_cast<int>(a >> 23) - 127;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  int shift = e < -14 ? 13 + (-14 - e) : 13;   // subnormals lose more bits
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  uint32_t bits = e < -14 ? r : ((static_cast<uint32_t>(e + 15) << 10) + (r - 0x400u));
  return static_cast<uint16_t>(sign | bits);
}
float from_f16(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu, u;
  if (e == 0) {
    float f = std::ldexp(static_cast<float>(m), -24);
    return sign ? -f : f;
  }
  if (e == 31) u = sign | 0x7f800000u | (m << 13);
  else u = sign | ((e + 112) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A host tensor: its values as the device type rounds them, and the bytes to upload.
struct Host {
  DType dt = DType::kF32;
  Vec v;
  std::string bytes() const {
    std::string b(v.size() * dtype_size(dt), '\0');
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kF32) {
        float f = static_cast<float>(v[i]);
        std::memcpy(&b[i * 4], &f, 4);
      } else {
        uint16_t h = dt == DType::kF16 ? to_f16(static_cast<float>(v[i])) : to_bf16(static_cast<float>(v[i]));
        std::memcpy(&b[i * 2], &h, 2);
      }
    }
    return b;
  }
  static double round(DType dt, double x) {
    float f = static_cast<float>(x);
    if (dt == DType::kF16) return from_f16(to_f16(f));
    if (dt == DType::kBF16) return from_bf16(to_bf16(f));
    return f;
  }
  static Vec decode(DType dt, const std::string& b) {
    Vec v(b.size() / dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kF32) {
        float f;
        std::memcpy(&f, &b[i * 4], 4);
        v[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, &b[i * 2], 2);
        v[i] = dt == DType::kF16 ? from_f16(h) : from_bf16(h);
      }
    }
    return v;
  }
};

// ---- fp64 references ---------------------------------------------------------------------------

// An expected output with a per-element error scale: |out - ref| <= rtol * scale + atol.
struct Expect {
  Vec ref, scale;
};

double gelu(double x, bool tanh_approx) {
  if (!tanh_approx) return 0.5 * x * (1 + std::erf(x * M_SQRT1_2));
  const double k = std::sqrt(2 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x, bool tanh_approx) {
  if (!tanh_approx) return 0.5 * (1 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
  const double k = std::sqrt(2 / M_PI), inner = k * (x + 0.044715 * x * x * x), t = std::tanh(inner);
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
double sigm(double x) { return 1 / (1 + std::exp(-x)); }

// Inputs by name (schema order) -> expected outputs (out0, out1, ...; empty for absent ones).
std::vector<Expect> reference(const OpCall& c, const std::map<std::string, Vec>& in) {
  const bool tanh_approx = c.string_arg("approximate", "none") == "tanh";
  auto each = [](const Vec& a, const std::function<double(double)>& f, const std::function<double(double)>& sc) {
    Expect e;
    for (double x : a) {
      e.ref.push_back(f(x));
      e.scale.push_back(sc(x));
    }
    return std::vector<Expect>{e};
  };
  auto each2 = [](const Vec& g, const Vec& b, const std::function<double(double, double)>& f) {
    Expect e;
    for (size_t i = 0; i < g.size(); ++i) {
      e.ref.push_back(f(g[i], b[i]));
      e.scale.push_back(std::fabs(g[i]) * (1 + (std::isfinite(b[i]) ? std::fabs(b[i]) : 0.0)));
    }
    return std::vector<Expect>{e};
  };
  auto mag = [](double x) { return 1 + (std::isfinite(x) ? std::fabs(x) : 0.0); };
  switch (c.op) {
    case OpId::kRelu: return each(in.at("self"), [](double x) { return (x > 0 || std::isnan(x)) ? x : 0.0; }, mag);
    case OpId::kGelu: return each(in.at("self"), [&](double x) { return gelu(x, tanh_approx); }, mag);
    case OpId::kSilu: return each(in.at("self"), [](double x) { return x * sigm(x); }, mag);
    case OpId::kSigmoid: return each(in.at("self"), sigm, mag);
    case OpId::kTanh: return each(in.at("self"), [](double x) { return std::tanh(x); }, mag);
    case OpId::kReluBackward: {
      const float th = static_cast<float>(c.double_arg("threshold", 0));
      const double t = Host::round(c.inputs[0].dtype, th);
      return each2(in.at("grad_output"), in.at("self"), [t](double g, double x) { return x <= t ? 0.0 : g; });
    }
    case OpId::kGeluBackward:
      return each2(in.at("grad_output"), in.at("self"), [&](double g, double x) { return g * gelu_grad(x, tanh_approx); });
    case OpId::kSiluBackward:
      return each2(in.at("grad_output"), in.at("self"),
                   [](double g, double x) { return g * sigm(x) * (1 + x * (1 - sigm(x))); });
    case OpId::kSigmoidBackward:
      return each2(in.at("grad_output"), in.at("output"), [](double g, double y) { return g * (1 - y) * y; });
    case OpId::kTanhBackward:
      return each2(in.at("grad_output"), in.at("output"), [](double g, double y) { return g * (1 - y * y); });
    default: break;
  }
  const bool log = c.op == OpId::kLogSoftmax || c.op == OpId::kLogSoftmaxBackward;
  if (c.op == OpId::kSoftmax || c.op == OpId::kLogSoftmax) {
    const Vec& x = in.at("self");
    const size_t L = c.inputs[0].sizes.back(), R = x.size() / L;
    Expect e{Vec(x.size()), Vec(x.size())};
    for (size_t r = 0; r < R; ++r) {
      const double* xr = &x[r * L];
      double m = -INFINITY;
      for (size_t j = 0; j < L; ++j) m = std::max(m, xr[j]);
      double s = 0;
      for (size_t j = 0; j < L; ++j) s += std::exp(xr[j] - m);
      for (size_t j = 0; j < L; ++j) {
        e.ref[r * L + j] = log ? (xr[j] - m) - std::log(s) : std::exp(xr[j] - m) / s;
        e.scale[r * L + j] = log ? 1 + std::fabs(xr[j] - m) + std::fabs(std::log(s)) : e.ref[r * L + j] + 1e-30;
      }
    }
    return {e};
  }
  if (c.op == OpId::kSoftmaxBackward || c.op == OpId::kLogSoftmaxBackward) {
    const Vec &g = in.at("grad_output"), &y = in.at("output");
    const size_t L = c.inputs[0].sizes.back(), R = g.size() / L;
    Expect e{Vec(g.size()), Vec(g.size())};
    for (size_t r = 0; r < R; ++r) {
      double d = 0, da = 0;
      for (size_t j = 0; j < L; ++j) {
        d += log ? g[r * L + j] : g[r * L + j] * y[r * L + j];
        da += std::fabs(log ? g[r * L + j] : g[r * L + j] * y[r * L + j]);
      }
      for (size_t j = 0; j < L; ++j) {
        const double gj = g[r * L + j], yj = y[r * L + j];
        e.ref[r * L + j] = log ? gj - std::exp(yj) * d : yj * (gj - d);
        e.scale[r * L + j] = log ? std::fabs(gj) + std::exp(yj) * da : std::fabs(yj) * (std::fabs(gj) + da);
      }
    }
    return {e};
  }
  // Layer norm forward and backward: M rows of N.
  const Vec& x = in.at("input");
  int64_t N = 1;
  for (int64_t s : c.list_arg("normalized_shape")) N *= s;
  const int64_t M = static_cast<int64_t>(x.size()) / N;
  const bool hw = c.input("weight")->defined, hb = c.input("bias")->defined;
  if (c.op == OpId::kLayerNorm) {
    const double eps = c.double_arg("eps", 1e-5);
    Expect y{Vec(x.size()), Vec(x.size())}, mean{Vec(M), Vec(M)}, rstd{Vec(M), Vec(M)};
    for (int64_t r = 0; r < M; ++r) {
      const double* xr = &x[r * N];
      double mu = 0, var = 0;
      for (int64_t j = 0; j < N; ++j) mu += xr[j];
      mu /= N;
      for (int64_t j = 0; j < N; ++j) var += (xr[j] - mu) * (xr[j] - mu);
      var /= N;
      const double rs = 1 / std::sqrt(var + eps);
      mean.ref[r] = mu;
      mean.scale[r] = std::fabs(mu) + std::sqrt(var);
      rstd.ref[r] = rs;
      rstd.scale[r] = rs * (1 + std::fabs(mu) * rs / 64);   // the mean's rounding moves var by ~eps*|mu|*std
      for (int64_t j = 0; j < N; ++j) {
        const double w = hw ? in.at("weight")[j] : 1, b = hb ? in.at("bias")[j] : 0, xh = (xr[j] - mu) * rs;
        y.ref[r * N + j] = xh * w + b;
        y.scale[r * N + j] = std::fabs(w) * (1 + std::fabs(xh) + std::fabs(mu) * rs / 64) + std::fabs(b);
      }
    }
    return {y, mean, rstd};
  }
  const Vec &g = in.at("grad_out"), &mu = in.at("mean"), &rs = in.at("rstd");
  std::vector<Expect> out(3);
  if (c.outputs[0].defined) out[0] = {Vec(x.size()), Vec(x.size())};
  if (c.outputs[1].defined) out[1] = {Vec(N, 0.0), Vec(N, 0.0)};
  if (c.outputs[2].defined) out[2] = {Vec(N, 0.0), Vec(N, 0.0)};
  for (int64_t r = 0; r < M; ++r) {
    double a = 0, b = 0, aa = 0, ba = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double w = hw ? in.at("weight")[j] : 1, wg = w * g[r * N + j], xh = (x[r * N + j] - mu[r]) * rs[r];
      a += wg;
      b += wg * xh;
      aa += std::fabs(wg);
      ba += std::fabs(wg * xh);
      if (c.outputs[1].defined) {
        out[1].ref[j] += g[r * N + j] * xh;
        out[1].scale[j] += std::fabs(g[r * N + j] * xh);
      }
      if (c.outputs[2].defined) {
        out[2].ref[j] += g[r * N + j];
        out[2].scale[j] += std::fabs(g[r * N + j]);
      }
    }
    if (!c.outputs[0].defined) continue;
    for (int64_t j = 0; j < N; ++j) {
      const double w = hw ? in.at("weight")[j] : 1, wg = w * g[r * N + j], xh = (x[r * N + j] - mu[r]) * rs[r];
      out[0].ref[r * N + j] = rs[r] * (wg - a / N - xh * b / N);
      out[0].scale[r * N + j] = rs[r] * (std::fabs(wg) + aa / N + std::fabs(xh) * (1 + ba / N));
    }
  }
  return out;
}

// ---- inputs --------------------------------------------------------------------------------------

// Values for one input of `c`, rounded to its dtype. Elementwise inputs get specials (NaN, +-inf,
// signed zeros, huge and tiny values) at the front; softmax rows get large offsets, a row of huge
// magnitude and a row holding -inf; layer norm rows have non-zero means.
Vec make_input(const OpCall& c, const TensorMeta& t, std::mt19937_64& rng) {
  const int64_t n = t.numel();
  std::normal_distribution<double> nd(0, 1);
  std::uniform_real_distribution<double> ud(-1, 1);
  Vec v(n);
  const OpFamily fam = op_info(c.op).family;
  if (fam == OpFamily::kUnary || fam == OpFamily::kUnaryBackward) {
    const bool lead_grad = t.name == "grad_output";
    for (auto& x : v) x = lead_grad ? 2 * ud(rng) : 6 * ud(rng);
    if (t.name == "output") {
      for (auto& x : v) x = c.op == OpId::kSigmoidBackward ? 0.5 + 0.5 * ud(rng) : ud(rng);
    } else if (!lead_grad) {
      const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 100, -100, 1e-30, 0.25, 1, -1, 30, -30};
      for (size_t i = 0; i < sizeof(specials) / sizeof(double) && i < v.size(); ++i) v[i] = specials[i];
    }
  } else if (c.op == OpId::kSoftmax || c.op == OpId::kLogSoftmax) {
    const int64_t L = t.sizes.back();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = i / L;
      v[i] = r % 3 == 1 ? 40 + 4 * nd(rng) : r % 5 == 2 ? 3e4 * nd(rng) : 3 * nd(rng);
    }
    if (n / L > 3) v[3 * L + (L > 1 ? 1 : 0)] = -INFINITY;
  } else if (fam == OpFamily::kSoftmaxBackward) {
    const int64_t L = t.sizes.back();
    if (t.name == "grad_output") {
      for (auto& x : v) x = nd(rng);
    } else {   // a valid (log-)softmax output
      for (int64_t r = 0; r < n / L; ++r) {
        double s = 0;
        for (int64_t j = 0; j < L; ++j) s += (v[r * L + j] = std::exp(2 * nd(rng)));
        for (int64_t j = 0; j < L; ++j) {
          const double p = v[r * L + j] / s;
          v[r * L + j] = c.op == OpId::kLogSoftmaxBackward ? std::log(p) : p;
        }
      }
    }
  } else {   // layer norm: rows with their own offset and spread
    if (t.name == "weight") for (auto& x : v) x = 1 + 0.5 * ud(rng);
    else if (t.name == "bias") for (auto& x : v) x = ud(rng);
    else if (t.name == "grad_out") for (auto& x : v) x = nd(rng);
    else {
      const int64_t N = n / std::max<int64_t>(1, c.outputs.size() == 3 && c.op == OpId::kLayerNorm
                                                     ? c.outputs[1].numel() : c.input("mean")->numel());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = i / N;
        v[i] = (r % 4 == 3 ? 100.0 : 3.0 * (r % 3)) + (1 + r % 2) * nd(rng);
      }
    }
  }
  for (auto& x : v) x = Host::round(t.dtype, x);
  return v;
}

// ---- the fixture -----------------------------------------------------------------------------

struct Gpu : ::testing::Test {
  const DriverApi* d = nullptr;
  Backend* b = nullptr;
  CUcontext primary = nullptr;
  CUdevice dev = 0;
  CUstream stream = nullptr;
  std::vector<CUdeviceptr> allocs;

  void SetUp() override {
    Status avail = cuda_available(0);
    if (!avail.is_ok()) GTEST_SKIP() << "no usable CUDA device: " << avail.to_string();
    auto be = cuda_backend(0);
    ASSERT_TRUE(be.is_ok()) << be.status().to_string();
    b = be.value();
    d = cuda_driver().value();
    ASSERT_EQ(d->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ASSERT_EQ(d->cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
    ASSERT_EQ(d->cuCtxSetCurrent(primary), CUDA_SUCCESS);
    ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (CUdeviceptr p : allocs) d->cuMemFree(p);
    if (stream) d->cuStreamDestroy(stream);
    if (primary) d->cuDevicePrimaryCtxRelease(dev);
  }
  CUdeviceptr alloc(size_t bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(d->cuMemAlloc(&p, std::max<size_t>(bytes, 16)), CUDA_SUCCESS);
    allocs.push_back(p);
    return p;
  }
  std::string download(CUdeviceptr p, size_t bytes) {
    std::string h(bytes, '\0');
    if (bytes) {
      EXPECT_EQ(d->cuMemcpyDtoH(h.data(), p, bytes), CUDA_SUCCESS);
    }
    return h;
  }
};

struct Case {
  OpId op;
  std::vector<int64_t> sizes;
  DType dt;
  json args;
  int samples;                    // random knob settings besides the defaults
  std::vector<Knobs> extra = {};  // settings that must be covered
};

std::string describe(const Case& k) {
  std::string s = op_info(k.op).name;
  s += "[";
  for (size_t i = 0; i < k.sizes.size(); ++i) s += (i ? "," : "") + std::to_string(k.sizes[i]);
  return s + "]" + dtype_name(k.dt) + (k.args.empty() ? "" : k.args.dump());
}

struct Counts {
  int candidates = 0, unsupported = 0;
};

// Runs every sampled candidate of `k` and compares against the fp64 reference.
void run_case(Gpu& g, const Case& k, Counts& counts, double rtol) {
  auto cr = make_call(k.op, k.sizes, k.dt, "cuda", k.args);
  ASSERT_TRUE(cr.is_ok()) << describe(k) << ": " << cr.status().to_string();
  const OpCall c = cr.value();
  const Template* t = nullptr;
  for (const Template* x : cuda_templates())
    if (!x->space(c).empty()) t = x;
  ASSERT_NE(t, nullptr) << describe(k);
  auto sp = t->space(c);
  // KC_GPU_TEST_MAX_NUMEL skips big shapes (for runs under compute-sanitizer).
  if (const char* mx = std::getenv("KC_GPU_TEST_MAX_NUMEL"))
    if (c.inputs[0].numel() > std::atoll(mx)) return;

  // Knob settings: defaults, the extra ones, then random ones (deterministic).
  std::vector<Knobs> settings = {Knobs{}};
  for (const auto& e : k.extra) settings.push_back(e);
  std::mt19937_64 krng(std::hash<std::string>{}(describe(k)) & 0xffffffff);
  for (int i = 0; i < k.samples; ++i) {
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
    } else {
      v = make_input(c, tm, rng);
    }
    Host h{tm.dtype, v};
    in_bytes.push_back(h.bytes());
    tensor_ptrs[i] = g.alloc(in_bytes.back().size());
    ASSERT_EQ(g.d->cuMemcpyHtoD(tensor_ptrs[i], in_bytes.back().data(), in_bytes.back().size()), CUDA_SUCCESS);
    in[tm.name] = std::move(v);
  }
  std::vector<size_t> out_bytes(c.outputs.size(), 0);
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    if (!c.outputs[o].defined) continue;
    out_bytes[o] = c.outputs[o].numel() * dtype_size(c.outputs[o].dtype);
    tensor_ptrs[c.inputs.size() + o] = g.alloc(out_bytes[o]);
  }
  const std::vector<Expect> want = reference(c, in);
  // Output rounding of halves: relative, and absolute in f16's subnormal range.
  const double out_ulp = k.dt == DType::kF16 ? std::ldexp(1.0, -10) : k.dt == DType::kBF16 ? std::ldexp(1.0, -7) : 0;
  const double out_floor = k.dt == DType::kF16 ? std::ldexp(1.0, -24) : 1e-30;

  for (size_t ci = 0; ci < cands.size(); ++ci) {
    const Candidate& cand = cands[ci];
    const std::string where = describe(k) + " " + cand.id();
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
      scratch.push_back(g.alloc(bytes));
      ptrs.push_back(reinterpret_cast<void*>(scratch.back()));
    }
    std::vector<std::string> first(c.outputs.size());
    for (int rep = 0; rep < 2; ++rep) {
      // Poison outputs and scratch (0xff bytes: NaN in every float type).
      for (size_t o = 0; o < c.outputs.size(); ++o) {
        if (!out_bytes[o]) continue;
        ASSERT_EQ(g.d->cuMemsetD8Async(tensor_ptrs[c.inputs.size() + o], 0xff, out_bytes[o], g.stream), CUDA_SUCCESS);
      }
      for (size_t s = 0; s < scratch.size(); ++s)
        ASSERT_EQ(g.d->cuMemsetD8Async(scratch[s], 0xff, rs->scratch_bytes[s], g.stream), CUDA_SUCCESS);
      ExecContext ctx;
      ctx.stream = g.stream;
      Status st = l.value()->run(ptrs.data(), ctx);
      ASSERT_TRUE(st.is_ok()) << where << ": " << st.to_string();
      ASSERT_EQ(g.d->cuStreamSynchronize(g.stream), CUDA_SUCCESS) << where;
      for (size_t o = 0; o < c.outputs.size(); ++o) {
        if (!out_bytes[o]) continue;
        std::string got = g.download(tensor_ptrs[c.inputs.size() + o], out_bytes[o]);
        if (rep == 1) {
          EXPECT_TRUE(got == first[o]) << where << ": out" << o << " differs between two runs";
          continue;
        }
        first[o] = got;
        const Vec out = Host::decode(c.outputs[o].dtype, got);
        const Expect& e = want[o];
        ASSERT_EQ(out.size(), e.ref.size()) << where;
        int64_t bad = 0;
        double worst = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          const double r = e.ref[i], y = out[i];
          bool ok;
          if (std::isnan(r)) ok = std::isnan(y);
          else if (std::isinf(r)) ok = y == r;
          else {
            const double tol = rtol * e.scale[i] + out_ulp * std::fabs(r) + out_floor;
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

void run_all(Gpu& g, const std::vector<Case>& cs, double rtol) {
  Counts n;
  for (const Case& k : cs) {
    run_case(g, k, n, rtol);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("%d candidates checked (%d settings kUnsupported)\n", n.candidates, n.unsupported);
}

const json kNone = json::object();

TEST_F(Gpu, Unary) {
  std::vector<Case> cs;
  for (OpId op : {OpId::kRelu, OpId::kGelu, OpId::kSilu, OpId::kSigmoid, OpId::kTanh}) {
    cs.push_back({op, {1}, DType::kF32, kNone, 1});
    cs.push_back({op, {7, 13, 5}, DType::kF32, kNone, 4});
    cs.push_back({op, {1000003}, DType::kF32, kNone, 6, {{{"grid_stride", 1}, {"vec", 4}, {"unroll", 8}, {"block", 128}}}});
  }
  cs.push_back({OpId::kGelu, {4099}, DType::kF32, {{"approximate", "tanh"}}, 6});
  cs.push_back({OpId::kGelu, {4099}, DType::kF16, {{"approximate", "tanh"}}, 3});
  cs.push_back({OpId::kRelu, {4099}, DType::kBF16, kNone, 3});
  cs.push_back({OpId::kSilu, {1025}, DType::kF16, kNone, 3});
  cs.push_back({OpId::kSigmoid, {77777}, DType::kBF16, kNone, 3});
  run_all(*this, cs, 2e-6);
}

TEST_F(Gpu, UnaryBackward) {
  std::vector<Case> cs;
  for (OpId op : {OpId::kReluBackward, OpId::kGeluBackward, OpId::kSiluBackward, OpId::kSigmoidBackward,
                  OpId::kTanhBackward}) {
    cs.push_back({op, {3}, DType::kF32, kNone, 1});
    cs.push_back({op, {513, 7}, DType::kF32, kNone, 4});
    cs.push_back({op, {(1 << 20) + 3}, DType::kF32, kNone, 4, {{{"grid_stride", 2}, {"vec", 2}}}});
  }
  cs.push_back({OpId::kReluBackward, {1000}, DType::kF32, {{"threshold", 0.25}}, 3});
  cs.push_back({OpId::kReluBackward, {1000}, DType::kBF16, {{"threshold", 1}}, 3});
  cs.push_back({OpId::kGeluBackward, {4097}, DType::kF32, {{"approximate", "tanh"}}, 4});
  cs.push_back({OpId::kTanhBackward, {999}, DType::kF16, kNone, 3});
  run_all(*this, cs, 4e-6);
}

TEST_F(Gpu, Softmax) {
  std::vector<Case> cs;
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax}) {
    cs.push_back({op, {1, 1}, DType::kF32, kNone, 1});
    cs.push_back({op, {5, 7}, DType::kF32, kNone, 4});
    cs.push_back({op, {130, 33}, DType::kF32, kNone, 4, {{{"threads", 32}, {"rows", 8}, {"regs", 1}, {"vec", 1}}}});
    cs.push_back({op, {33, 1000}, DType::kF32, kNone, 8,
                  {{{"online", 1}, {"regs", 0}}, {{"online", 1}, {"regs", 1}}, {{"threads", 1024}, {"regs", 0}}}});
    cs.push_back({op, {7, 4096}, DType::kF32, kNone, 4});
    cs.push_back({op, {3, 40000}, DType::kF32, kNone, 4, {{{"threads", 32}, {"regs", 0}, {"online", 1}}}});
    cs.push_back({op, {64, 200}, DType::kF16, kNone, 3});
    cs.push_back({op, {17, 1024}, DType::kBF16, kNone, 3});
  }
  run_all(*this, cs, 1e-5);
}

TEST_F(Gpu, SoftmaxBackward) {
  std::vector<Case> cs;
  for (OpId op : {OpId::kSoftmaxBackward, OpId::kLogSoftmaxBackward}) {
    cs.push_back({op, {1, 1}, DType::kF32, kNone, 1});
    cs.push_back({op, {130, 33}, DType::kF32, kNone, 4});
    cs.push_back({op, {33, 1000}, DType::kF32, kNone, 6});
    cs.push_back({op, {3, 40000}, DType::kF32, kNone, 3});
    cs.push_back({op, {64, 200}, DType::kF16, kNone, 2});
  }
  run_all(*this, cs, 1e-5);
}

TEST_F(Gpu, LayerNorm) {
  std::vector<Case> cs;
  for (const json& a : {json{{"normalized_shape", {5}}}, json{{"normalized_shape", {5}}, {"affine", false}},
                        json{{"normalized_shape", {5}}, {"bias", false}}})
    cs.push_back({OpId::kLayerNorm, {3, 5}, DType::kF32, a, 2});
  cs.push_back({OpId::kLayerNorm, {37, 130}, DType::kF32, {{"normalized_shape", {130}}}, 6});
  cs.push_back({OpId::kLayerNorm, {4096, 1024}, DType::kF32, {{"normalized_shape", {1024}}}, 6});
  cs.push_back({OpId::kLayerNorm, {2, 3, 4096}, DType::kF32, {{"normalized_shape", {3, 4096}}, {"affine", false}}, 4,
                {{{"split", 0}}}});
  cs.push_back({OpId::kLayerNorm, {5, 70000}, DType::kF32, {{"normalized_shape", {70000}}}, 4,
                {{{"split", 33}, {"vec", 4}}, {{"split", 0}, {"threads", 1024}}}});
  cs.push_back({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32, {{"normalized_shape", {64, 256, 256}}}, 3,
                {{{"split", 132}}, {{"split", 1056}, {"threads", 512}}, {{"split", 0}}}});
  cs.push_back({OpId::kLayerNorm, {1, 64, 256, 256}, DType::kF32,
                {{"normalized_shape", {64, 256, 256}}, {"affine", false}}, 1});
  run_all(*this, cs, 2e-5);
}

TEST_F(Gpu, LayerNormBackward) {
  std::vector<Case> cs;
  for (const json& mask : {json{1, 1, 1}, json{1, 0, 0}, json{0, 1, 1}, json{0, 0, 1}}) {
    cs.push_back({OpId::kLayerNormBackward, {3, 5}, DType::kF32, {{"normalized_shape", {5}}, {"output_mask", mask}}, 2});
    cs.push_back({OpId::kLayerNormBackward, {1, 64, 256, 256}, DType::kF32,
                  {{"normalized_shape", {64, 256, 256}}, {"output_mask", mask}}, 1});
  }
  cs.push_back({OpId::kLayerNormBackward, {333, 131}, DType::kF32, {{"normalized_shape", {131}}}, 6,
                {{{"col_split", 8}, {"col_ty", 4}}}});
  cs.push_back({OpId::kLayerNormBackward, {4096, 1024}, DType::kF32, {{"normalized_shape", {1024}}}, 5});
  cs.push_back({OpId::kLayerNormBackward, {33, 131}, DType::kF32,
                {{"normalized_shape", {131}}, {"affine", false}, {"output_mask", {1, 0, 0}}}, 3});
  cs.push_back({OpId::kLayerNormBackward, {3, 70000}, DType::kF32, {{"normalized_shape", {70000}}}, 3,
                {{{"split", 33}}}});
  run_all(*this, cs, 2e-5);
}

// Times the default candidate (and a few split settings) of the shapes that matter most.
TEST_F(Gpu, Timings) {
  struct T {
    OpId op;
    std::vector<int64_t> sizes;
    json args;
    std::vector<Knobs> knobs;
    double bytes;   // memory traffic of one call, for GB/s
  };
  const double big = 64.0 * 256 * 256 * 4;
  std::vector<T> ts = {
      {OpId::kLayerNorm, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}},
       {{}, {{"split", 264}}, {{"split", 528}, {"threads", 512}}, {{"split", 1056}}, {{"split", 1056}, {"threads", 512}}},
       2 * big},
      {OpId::kLayerNorm, {4096, 1024}, {{"normalized_shape", {1024}}}, {{}}, 2 * 4096.0 * 1024 * 4},
      {OpId::kLayerNorm, {16 * 1024, 4096}, {{"normalized_shape", {4096}}}, {{}}, 2 * 16384.0 * 4096 * 4},
      {OpId::kLayerNormBackward, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}}, {{}}, 3 * big + 2 * 4 * 64 * 65536},
      {OpId::kLayerNormBackward, {4096, 1024}, {{"normalized_shape", {1024}}}, {{}}, 3 * 4096.0 * 1024 * 4},
      {OpId::kSoftmax, {4096, 1024}, kNone, {{}}, 2 * 4096.0 * 1024 * 4},
      {OpId::kGelu, {1 << 26}, kNone, {{}}, 2 * 4.0 * (1 << 26)},
  };
  for (const T& t : ts) {
    auto cr = make_call(t.op, t.sizes, DType::kF32, "cuda", t.args);
    ASSERT_TRUE(cr.is_ok());
    const OpCall c = cr.value();
    const Template* tp = nullptr;
    for (const Template* x : cuda_templates())
      if (!x->space(c).empty()) tp = x;
    ASSERT_NE(tp, nullptr);
    Binding bind = c.binding();
    std::vector<void*> ptrs;
    for (const auto& tm : bind.tensors) {
      if (!tm.defined) {
        ptrs.push_back(nullptr);
        continue;
      }
      CUdeviceptr p = alloc(tm.numel() * dtype_size(tm.dtype));
      ASSERT_EQ(d->cuMemsetD8Async(p, 0, tm.numel() * dtype_size(tm.dtype), stream), CUDA_SUCCESS);
      ptrs.push_back(reinterpret_cast<void*>(p));
    }
    for (const Knobs& kn : t.knobs) {
      auto r = tp->render(c, kn);
      if (!r.is_ok()) continue;
      auto bin = b->compile(r->source);
      ASSERT_TRUE(bin.is_ok()) << bin.status().to_string();
      auto rs = resolve(parse_launch_spec(r->launch).value(), bind);
      ASSERT_TRUE(rs.is_ok());
      auto l = b->load(bin->binary, rs.value());
      ASSERT_TRUE(l.is_ok()) << l.status().to_string();
      std::vector<void*> all = ptrs;
      for (int64_t bytes : rs->scratch_bytes) all.push_back(reinterpret_cast<void*>(alloc(bytes)));
      ExecContext ctx;
      ctx.stream = stream;
      TimingOptions o;
      o.budget_ms = 200;
      auto tm = time_cuda(stream, [&] { return l.value()->run(all.data(), ctx); }, o);
      ASSERT_TRUE(tm.is_ok()) << tm.status().to_string();
      std::printf("%-28s %-70s %8.4f ms  %6.0f GB/s\n", (std::string(op_info(t.op).name) + " " + json(t.sizes).dump()).c_str(),
                  r->id().c_str(), tm->median_ms, t.bytes / (tm->median_ms * 1e6));
      if (t.op == OpId::kLayerNorm && t.sizes.size() == 4 && kn.empty()) {
        EXPECT_LT(tm->median_ms, 0.2) << "the default split layer norm of one 4M-element row";
      }
    }
  }
}

}  // namespace
}  // namespace kc::evolve
