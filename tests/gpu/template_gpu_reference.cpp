// Host-side data for the CUDA template tests; see template_gpu_reference.h.
#include "tests/gpu/template_gpu_reference.h"

#include <algorithm>
#include <cmath>

#include "evolve/ops/pool.h"
#include "runtime/ops.h"
#include "tests/unit/reduction_reference.h"

namespace kc::evolve::gpu_ref {

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

// ---- fp64 references ---------------------------------------------------------------------------

namespace {

// Group norm: (n, g) rows of C / group * HxW, per-channel affine. Kernels fold the affine into
// y = x * a + b' (a = rstd * w), which rounds x * a at |x| * rstd: hence |mu| * rs / 16 in the scale.
std::vector<Expect> group_norm(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec& x = in.at("input");
  const int64_t hw = c.int_arg("HxW", 1), groups = c.int_arg("group", 1), M = c.outputs[1].numel();
  const int64_t L = static_cast<int64_t>(x.size()) / M, cpg = L / hw;
  const bool hw_ = c.input("weight")->defined, hb = c.input("bias")->defined;
  const double eps = c.double_arg("eps", 1e-5);
  Expect y{Vec(x.size()), Vec(x.size())}, mean{Vec(M), Vec(M)}, rstd{Vec(M), Vec(M)};
  for (int64_t r = 0; r < M; ++r) {
    const double* xr = &x[r * L];
    double mu = 0, var = 0;
    for (int64_t j = 0; j < L; ++j) mu += xr[j];
    mu /= L;
    for (int64_t j = 0; j < L; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= L;
    const double rs = 1 / std::sqrt(var + eps);
    mean.ref[r] = mu;
    mean.scale[r] = std::fabs(mu) + std::sqrt(var);
    rstd.ref[r] = rs;
    rstd.scale[r] = rs * (1 + std::fabs(mu) * rs / 64);
    for (int64_t j = 0; j < L; ++j) {
      const int64_t ch = (r % groups) * cpg + j / hw;
      const double w = hw_ ? in.at("weight")[ch] : 1, b = hb ? in.at("bias")[ch] : 0, xh = (xr[j] - mu) * rs;
      y.ref[r * L + j] = xh * w + b;
      y.scale[r * L + j] = std::fabs(w) * (1 + std::fabs(xh) + std::fabs(mu) * rs / 16) + std::fabs(b);
    }
  }
  return {y, mean, rstd};
}

// Batch norm per channel over N planes of HxW: training from the batch moments (group norm's
// bounds), eval elementwise from the running statistics (save_mean = running_mean and
// save_invstd = 1 / sqrt(running_var + eps), eager's CUDA answer).
std::vector<Expect> batch_norm(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec& x = in.at("input");
  const int64_t N = c.input("input")->sizes[0], C = c.input("input")->sizes[1];
  const int64_t hw = static_cast<int64_t>(x.size()) / (N * C);
  const bool train = c.int_arg("training", 1) != 0, hw_ = c.input("weight")->defined, hb = c.input("bias")->defined;
  const double eps = c.double_arg("eps", 1e-5);
  Expect y{Vec(x.size()), Vec(x.size())}, mean{Vec(C), Vec(C)}, rstd{Vec(C), Vec(C)};
  for (int64_t ch = 0; ch < C; ++ch) {
    double mu = 0, var = 0;
    if (train) {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < hw; ++j) mu += x[(n * C + ch) * hw + j];
      mu /= N * hw;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < hw; ++j) var += (x[(n * C + ch) * hw + j] - mu) * (x[(n * C + ch) * hw + j] - mu);
      var /= N * hw;
    } else {
      mu = in.at("running_mean")[ch];
      var = in.at("running_var")[ch];
    }
    const double rs = 1 / std::sqrt(var + eps);
    mean.ref[ch] = mu;
    mean.scale[ch] = std::fabs(mu) + std::sqrt(var);
    rstd.ref[ch] = rs;
    rstd.scale[ch] = rs * (1 + std::fabs(mu) * rs / 64);
    const double w = hw_ ? in.at("weight")[ch] : 1, b = hb ? in.at("bias")[ch] : 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t i = (n * C + ch) * hw + j;
        const double xh = (x[i] - mu) * rs;
        y.ref[i] = xh * w + b;
        y.scale[i] = std::fabs(w) * (1 + std::fabs(xh)) + std::fabs(b);
      }
  }
  return {y, mean, rstd};
}

// Pooling from the definition, windows scanned in (t, h, w) order: max values and indices exact
// (scale 0), an average (adaptive: over the adaptive window) within rtol of its window's mean
// magnitude.
std::vector<Expect> pool(const OpCall& c, const std::map<std::string, Vec>& in) {
  const PoolGeom g = pool_geometry(c).value();
  const Vec& x = in.at("self");
  const int64_t plane = g.in[0] * g.in[1] * g.in[2], n = g.planes * g.out[0] * g.out[1] * g.out[2];
  std::vector<Expect> out(g.indices ? 2 : 1, Expect{Vec(n), Vec(n, 0.0)});
  int64_t o = 0;
  for (int64_t pl = 0; pl < g.planes; ++pl)
    for (int64_t ot = 0; ot < g.out[0]; ++ot)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          const int64_t at[3] = {ot, oh, ow};
          int64_t lo[3], hi[3], st[3], padded = 1;
          for (int a = 0; a < 3; ++a) {
            st[a] = g.max ? g.d[a] : 1;
            if (g.adaptive) {   // [floor(o In / Out), ceil((o + 1) In / Out))
              lo[a] = at[a] * g.in[a] / g.out[a];
              hi[a] = ((at[a] + 1) * g.in[a] + g.out[a] - 1) / g.out[a];
              padded *= hi[a] - lo[a];
              continue;
            }
            lo[a] = at[a] * g.s[a] - g.p[a];
            hi[a] = g.max ? std::min(lo[a] + (g.k[a] - 1) * g.d[a] + 1, g.in[a]) : std::min(lo[a] + g.k[a], g.in[a] + g.p[a]);
            padded *= hi[a] - lo[a];
            while (lo[a] < 0) lo[a] += st[a];
            hi[a] = std::min(hi[a], g.in[a]);
          }
          double m = -INFINITY, s = 0, sa = 0, cnt = 0;
          int64_t best = (lo[0] * g.in[1] + lo[1]) * g.in[2] + lo[2];
          for (int64_t t = lo[0]; t < hi[0]; t += st[0])
            for (int64_t h = lo[1]; h < hi[1]; h += st[1])
              for (int64_t w = lo[2]; w < hi[2]; w += st[2]) {
                const int64_t i = (t * g.in[1] + h) * g.in[2] + w;
                const double v = x[pl * plane + i];
                if (v > m || std::isnan(v)) m = v, best = i;
                s += v, sa += std::fabs(v), cnt += 1;
              }
          if (g.max) {
            out[0].ref[o] = m;
            if (g.indices) out[1].ref[o] = static_cast<double>(best);
            continue;
          }
          const double div = g.divisor ? g.divisor : g.count_include_pad ? padded : cnt;
          out[0].ref[o] = s / div;
          out[0].scale[o] = (sa + std::fabs(s)) / std::fabs(div);
        }
  return out;
}

// Inclusive scans along dim in fp64, in order. Scales: cumsum sqrt(j + 1) * sum |x| (any fold
// order), cumprod (2 sqrt(j + 1) + 1) |y| (relative), logcumsumexp |max| + sqrt(j + 1) (1 + |y|)
// (every log-domain combine rounds |y|).
std::vector<Expect> scan(const OpCall& c, const std::map<std::string, Vec>& in) {
  const Vec& x = in.at("self");
  const auto& sz = c.inputs[0].sizes;
  const int64_t nd = static_cast<int64_t>(sz.size());
  int64_t dim = c.int_arg("dim", -1);
  if (dim < 0) dim += nd;
  int64_t inner = 1;
  for (int64_t i = dim + 1; i < nd; ++i) inner *= sz[i];
  const int64_t L = sz[dim], outer = static_cast<int64_t>(x.size()) / (L * inner);
  Expect e{Vec(x.size()), Vec(x.size())};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      double a = 0, sa = 0, m = -INFINITY;
      for (int64_t l = 0; l < L; ++l) {
        const size_t i = (o * L + l) * inner + j;
        const double v = x[i], g = std::sqrt(l + 1.0);
        if (c.op == OpId::kCumsum) a = l ? a + v : v;
        else if (c.op == OpId::kCumprod) a = l ? a * v : v;
        else if (l && (std::isnan(a) || std::isnan(v))) a = NAN;
        else if (l && !(a == v && std::isinf(a))) a = std::max(a, v) + std::log1p(std::exp(-std::fabs(a - v)));
        else if (!l) a = v;
        if (std::isfinite(v)) sa += std::fabs(v), m = std::max(m, std::fabs(v));
        e.ref[i] = a;
        e.scale[i] = c.op == OpId::kCumsum ? g * sa + std::fabs(a)
                     : c.op == OpId::kCumprod ? (2 * g + 1) * std::fabs(a)
                                              : m + g * (1 + (std::isfinite(a) ? std::fabs(a) : 0.0));
      }
    }
  return {e};
}

// Softmax and log_softmax over the last dim, in fp64 per row.
std::vector<Expect> softmax(const OpCall& c, const std::map<std::string, Vec>& in) {
  const bool log = c.op == OpId::kLogSoftmax;
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

// Their backward from the forward's output: the row's dot product, then each element.
std::vector<Expect> softmax_backward(const OpCall& c, const std::map<std::string, Vec>& in) {
  const bool log = c.op == OpId::kLogSoftmaxBackward;
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

// The reductions, from the CPU tests' fold (tests/unit/reduction_reference.h).
std::vector<Expect> reduction(const OpCall& c, const std::map<std::string, Vec>& in) {
  const ReduceGeom g = reduce_geometry(c).value();
  const int64_t n = c.outputs[0].numel();
  std::vector<Expect> out(c.outputs.size(), Expect{Vec(n), Vec(n)});
  for (int64_t o = 0; o < n; ++o) {
    const red_ref::Out r = red_ref::fold(g, in.at("self"), o, c.outputs[0].dtype == DType::kF32 ? 1.19e-7 : 7.8e-3);
    out[0].ref[o] = r.ref, out[0].scale[o] = r.scale;
    if (out.size() > 1) out[1].ref[o] = r.out1, out[1].scale[o] = r.out1_scale;
  }
  return out;
}

}  // namespace

// Inputs by name (schema order) -> expected outputs (out0, out1, ...; empty for absent ones).
std::vector<Expect> reference(const OpCall& c, const std::map<std::string, Vec>& in) {
  switch (op_info(c.op).family) {
    case OpFamily::kUnary: return unary(c, in);                     // template_gpu_reference_unary.cpp
    case OpFamily::kUnaryBackward: return unary_backward(c, in);
    case OpFamily::kSoftmax: return softmax(c, in);
    case OpFamily::kSoftmaxBackward: return softmax_backward(c, in);
    case OpFamily::kGroupNorm: return group_norm(c, in);
    case OpFamily::kBatchNorm: return batch_norm(c, in);
    case OpFamily::kBatchNormBackward: return batch_norm_backward(c, in);
    case OpFamily::kGroupNormBackward: return group_norm_backward(c, in);
    case OpFamily::kEmbeddingBackward: return embedding_backward(c, in);
    case OpFamily::kScan: return scan(c, in);
    case OpFamily::kPool: return pool(c, in);
    case OpFamily::kReduction: return reduction(c, in);
    case OpFamily::kPoolBackward: return pool_backward(c, in);
    case OpFamily::kLoss: return loss(c, in);
    case OpFamily::kLossBackward: return loss_backward(c, in);
    case OpFamily::kCrossEntropy: return cross_entropy(c, in);
    case OpFamily::kCrossEntropyBackward: return cross_entropy_backward(c, in);
    case OpFamily::kRmsNorm: return rms_norm(c, in);
    case OpFamily::kRmsNormBackward: return rms_norm_backward(c, in);
    case OpFamily::kKlDiv: return kl_div(c, in);
    case OpFamily::kKlDivBackward: return kl_div_backward(c, in);
    default: return layer_norm(c, in);   // template_gpu_layer_norm.cpp
  }
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
  } else if (fam == OpFamily::kScan) {
    // cumprod: factors near 1 keep long products finite; logcumsumexp: an all -inf prefix in the
    // first two lines, one +inf and one NaN further on.
    for (auto& x : v) x = c.op == OpId::kCumprod ? 1 + 0.01 * nd(rng) : c.op == OpId::kCumsum ? nd(rng) : 3 * nd(rng);
    if (c.op == OpId::kLogcumsumexp && n > 64) {
      v[0] = v[1] = -INFINITY;
      v[n / 3 + 3] = INFINITY;
      v[n / 2 + 7] = NAN;
    }
  } else if (fam == OpFamily::kBatchNorm || fam == OpFamily::kBatchNormBackward) {   // channels with their own offset and spread
    const int64_t C = t.sizes.size() > 1 ? t.sizes[1] : 1, hw = t.sizes.size() > 1 ? n / (t.sizes[0] * C) : 1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ch = t.name == "input" ? (i / hw) % C : i;
      v[i] = t.name == "running_var" || t.name == "save_invstd" ? 0.1 + std::fabs(2 * nd(rng))
           : t.name == "input" ? (ch % 4 == 3 ? 100.0 : 3.0 * (ch % 3)) + (1 + ch % 2) * nd(rng)
                               : nd(rng);
    }
  } else if (fam == OpFamily::kGroupNormBackward) {
    v = group_norm_backward_input(c, t, rng);
  } else if (fam == OpFamily::kPoolBackward) {   // grad_output and self normal; indices: argmax_indices
    for (auto& x : v) x = nd(rng);
  } else if (fam == OpFamily::kPool) {   // normal values, and NaN / -inf now and then (eager's order)
    for (auto& x : v) x = 2 * nd(rng);
    for (int64_t i = 5; i < n; i += 1009) v[i] = i % 2 ? NAN : -INFINITY;
  } else if (fam == OpFamily::kReduction) {
    // Stretches offset by 100 (the variance's cancellation), a run of ties (argmax's first
    // index), and one NaN, +inf and -inf, so only a few outputs are non-finite.
    for (int64_t i = 0; i < n; ++i) v[i] = ((i / 1000) % 4 == 3 ? 100.0 : 0.0) + 3 * nd(rng);
    for (int64_t i = n / 2; i < n / 2 + 64 && n > 256; ++i) v[i] = v[n / 2];
    if (n > 256) v[n / 7] = NAN, v[n / 5] = INFINITY, v[n / 3] = -INFINITY;
    // Prod: factors of either sign near 1 (e^(0.01 z)), so even 2^22 of them stay well inside
    // fp32's range and the relative error is what is tested; one zero and one NaN where there
    // are several outputs (a single output would be only NaN).
    if (c.op == OpId::kProd) {
      for (int64_t i = 0; i < n; ++i) v[i] = std::exp(0.01 * nd(rng)) * (ud(rng) < 0 ? -1.0 : 1.0);
      if (n > 256 && c.outputs[0].numel() > 1) v[n / 7] = NAN, v[n / 3] = 0.0;
    }
  } else if (fam == OpFamily::kLoss || fam == OpFamily::kLossBackward) {
    v = loss_input(c, t, rng);
  } else if (fam == OpFamily::kEmbeddingBackward) {
    v = embedding_input(c, t, rng);
  } else if (fam == OpFamily::kCrossEntropy || fam == OpFamily::kCrossEntropyBackward) {
    return ce_input(c, t, rng);   // rounded there
  } else if (fam == OpFamily::kRmsNorm || fam == OpFamily::kRmsNormBackward) {
    return rms_input(c, t, rng);   // rounded there
  } else if (fam == OpFamily::kKlDiv || fam == OpFamily::kKlDivBackward) {
    return kl_input(c, t, rng);   // rounded there
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
      const bool fwd = c.outputs.size() == 3 && (c.op == OpId::kLayerNorm || c.op == OpId::kGroupNorm);
      const int64_t N = n / std::max<int64_t>(1, fwd ? c.outputs[1].numel() : c.input("mean")->numel());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = i / N;
        v[i] = (r % 4 == 3 ? 100.0 : 3.0 * (r % 3)) + (1 + r % 2) * nd(rng);
      }
    }
  }
  for (auto& x : v) x = Host::round(t.dtype, x);
  return v;
}

}  // namespace kc::evolve::gpu_ref
