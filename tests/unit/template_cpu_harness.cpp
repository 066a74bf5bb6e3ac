// The CPU template tests' harness (template_cpu_harness.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "evolve/propose/proposer.h"
#include "evolve/verify/static_check.h"
#include "runtime/cpu_backend.h"
#include "runtime/launch_spec.h"
#include "tests/unit/template_cpu_harness.h"
#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve {

using nlohmann::json;

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// A parallel_for over 3 std::threads with uneven parts, as at::parallel_for may split a range.
void threaded_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t cut1 = n / 5, cut2 = n / 5 + (n - n / 5) / 2;
  std::vector<std::pair<int64_t, int64_t>> parts = {{0, cut1}, {cut1, cut2}, {cut2, n}};
  std::vector<std::thread> ts;
  for (auto [b, e] : parts)
    if (b < e) ts.emplace_back(fn, b, e);
  for (auto& t : ts) t.join();
}

// Compiled binaries by source text, shared by every test in this file.
namespace {
std::mutex g_compile_mu;
std::map<std::string, Compiled> g_compiled;
int g_compiles = 0;
}  // namespace

// Compiles every source not compiled yet, two at a time (the compiler runs as a child process).
void compile_all(const std::set<std::string>& sources) {
  std::vector<std::string> todo;
  {
    std::lock_guard<std::mutex> g(g_compile_mu);
    for (const auto& s : sources)
      if (!g_compiled.count(s)) todo.push_back(s);
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < todo.size();) {
      auto r = cpu_backend().compile(todo[i]);
      Compiled c;
      c.ok = r.is_ok();
      if (c.ok) {
        c.binary = std::move(r->binary);
        c.log = std::move(r->log);
      } else {
        c.error = r.status().to_string();
      }
      std::lock_guard<std::mutex> g(g_compile_mu);
      g_compiled[todo[i]] = std::move(c);
      ++g_compiles;
    }
  };
  std::thread t1(worker), t2(worker);
  t1.join();
  t2.join();
}

const Compiled& compiled(const std::string& src) {
  std::lock_guard<std::mutex> g(g_compile_mu);
  return g_compiled.at(src);
}

OpCall must(Result<OpCall> r) {
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r.value()) : OpCall{};
}

OpCall cpu_call(OpId op, std::vector<int64_t> sizes, json args) {
  return must(make_call(op, sizes, DType::kF32, BackendKind::kCpu, args));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out.empty() ? "scalar" : out;
}

namespace {

using cpu_ref::Buffers;
using cpu_ref::Expect;
using cpu_ref::compare;
using cpu_ref::reference;

// Values x[1..9] of unary inputs: NaN, -0, large and tiny magnitudes, a threshold value.
const float kSpecials[] = {NAN, -0.0f, 50.f, -50.f, 100.f, -100.f, 1e-30f, -1e-30f, 0.5f};

Buffers make_inputs(const Case& cs) {
  const OpCall& c = cs.call;
  Buffers b;
  std::mt19937 rng(static_cast<uint32_t>(fnv(cs.label)));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const OpFamily fam = op_info(c.op).family;
  for (const auto& t : c.inputs) {
    if (!t.defined) continue;
    std::vector<float>& v = b[t.name];
    v.resize(t.numel());
    for (auto& x : v) x = nd(rng);
    if (fam == OpFamily::kUnary || fam == OpFamily::kUnaryBackward) {
      if (t.name == "self") {
        for (auto& x : v) x *= 3.f;
        for (size_t i = 1; i < 10 && v.size() >= 16; ++i) v[i] = kSpecials[i - 1];
      } else if (t.name == "output") {   // sigmoid: (0, 1); tanh: (-1, 1)
        for (auto& x : v) x = c.op == OpId::kSigmoidBackward ? ud(rng) : 2.f * ud(rng) - 1.f;
      }
    }
    if ((t.name == "self" && fam == OpFamily::kSoftmax) || (t.name == "input" && (fam == OpFamily::kLayerNorm || fam == OpFamily::kGroupNorm || fam == OpFamily::kBatchNorm || fam == OpFamily::kBatchNormBackward ||
                                       fam == OpFamily::kGroupNormBackward))) {
      for (auto& x : v) x = 2.f * x + static_cast<float>(cs.offset);
      if (cs.nan_row) v[3 * t.sizes.back() + 17] = NAN;
    }
  }
  // Prod: factors of either sign near 1 (e^(0.05 z)), so a row of 70001 stays inside fp32's range.
  if (c.op == OpId::kProd)
    for (auto& x : b["self"]) x = std::exp(0.05f * x) * (ud(rng) < 0.5f ? -1.f : 1.f);
  if (fam == OpFamily::kLoss || fam == OpFamily::kLossBackward) cpu_ref::loss_inputs(c, b, fnv(cs.label));
  if (b.count("running_var"))   // batch norm: a variance is positive
    for (auto& v : b["running_var"]) v = std::fabs(v) + 0.1f;
  if (fam == OpFamily::kSoftmaxBackward) {   // `output` is a real (log-)softmax of random logits
    const int64_t n = c.input("output")->sizes.back(), rows = c.input("output")->numel() / n;
    std::vector<float>& y = b["output"];
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, 3.0 * y[r * n + j]);
      for (int64_t j = 0; j < n; ++j) s += std::exp(3.0 * y[r * n + j] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double l = 3.0 * y[r * n + j] - m - std::log(s);
        y[r * n + j] = static_cast<float>(c.op == OpId::kSoftmaxBackward ? std::exp(l) : l);
      }
    }
  }
  if (c.op == OpId::kLayerNormBackward) {   // mean and rstd as the forward pass saved them
    std::vector<float>& x = b["input"];
    for (auto& v : x) v = 2.f * v + 0.5f;
    const int64_t rows = c.input("mean")->numel(), n = c.input("input")->numel() / rows;
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, q = 0;
      for (int64_t j = 0; j < n; ++j) s += x[r * n + j];
      const double mu = s / n;
      for (int64_t j = 0; j < n; ++j) q += (x[r * n + j] - mu) * (x[r * n + j] - mu);
      b["mean"][r] = static_cast<float>(mu);
      b["rstd"][r] = static_cast<float>(1.0 / std::sqrt(q / n + 1e-5));
    }
  }
  if (c.op == OpId::kBatchNormBackward) cpu_ref::batch_norm_backward_inputs(c, b);
  if (c.op == OpId::kGroupNormBackward) cpu_ref::group_norm_backward_inputs(c, b);
  if (fam == OpFamily::kEmbeddingBackward) cpu_ref::embedding_backward_inputs(c, b, fnv(cs.label));
  if (c.op == OpId::kMaxPool2dBackward || c.op == OpId::kMaxPool3dBackward) cpu_ref::argmax_indices(c, b);
  return b;
}


// ---------------------------------------------------------------------------------------------
// Knob settings: the default, and pseudo-random ones. Knobs that change the source text (code
// shape: unroll, simd, accumulator, ...) take, per op variant, either their defaults or one
// alternative setting drawn once for that variant, so each variant compiles two sources and every
// shape reuses them; knobs that only change the launch spec (work split) are drawn freely.

std::vector<std::string> source_knobs(const Template& t, const OpCall& c, const std::vector<KnobDim>& space) {
  std::vector<std::string> names;
  auto base = t.render(c, {});
  if (!base.is_ok()) return names;
  for (const auto& d : space) {
    for (size_t i = 1; i < d.values.size(); ++i) {
      auto r = t.render(c, {{d.name, d.values[i]}});
      if (r.is_ok() && r->source != base->source) {
        names.push_back(d.name);
        break;
      }
    }
  }
  return names;
}

struct Plan {
  std::map<std::string, Knobs> alt_by_variant;   // variant (default source text) -> source knobs
};

std::vector<Knobs> knob_sample(const Template& t, const Case& cs, Plan& plan, int n_random) {
  const OpCall& c = cs.call;
  std::vector<KnobDim> space = t.space(c);
  std::vector<Knobs> out = {Knobs{}};
  auto base = t.render(c, {});
  if (!base.is_ok()) return out;
  std::vector<std::string> src_knobs = source_knobs(t, c, space);
  std::mt19937_64 rng(fnv(cs.label + t.name()));
  auto draw = [&](const KnobDim& d) { return d.values[rng() % d.values.size()]; };
  if (!plan.alt_by_variant.count(base->source) && !src_knobs.empty()) {
    // The alternative moves every code knob off its default where that renders; otherwise (some
    // pairs are kUnsupported) it moves one knob, rotating over the variants, and the rest at random.
    const size_t forced = plan.alt_by_variant.size() % src_knobs.size();
    auto off_default = [&](const KnobDim& d) { return d.values[1 + rng() % (d.values.size() - 1)]; };
    Knobs alt;
    for (int attempt = 0; attempt < 40; ++attempt) {
      alt.clear();
      for (const auto& d : space) {
        auto it = std::find(src_knobs.begin(), src_knobs.end(), d.name);
        if (it == src_knobs.end()) continue;
        const bool move = attempt < 10 || static_cast<size_t>(it - src_knobs.begin()) == forced || rng() % 2;
        alt[d.name] = move ? off_default(d) : d.values[0];
      }
      if (t.render(c, alt).is_ok()) break;
    }
    plan.alt_by_variant[base->source] = alt;
  }
  const Knobs& alt = plan.alt_by_variant[base->source];
  for (int i = 0; i < n_random; ++i) {
    Knobs k;
    for (const auto& d : space) {
      if (std::find(src_knobs.begin(), src_knobs.end(), d.name) == src_knobs.end()) k[d.name] = draw(d);
      else if (i % 2 == 0 && alt.count(d.name)) k[d.name] = alt.at(d.name);
    }
    out.push_back(k);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Running one candidate.

struct Job {
  const Case* cs;
  Candidate cand;
  ResolvedSpec spec;
};

// Renders and resolves; kUnsupported renders are counted, anything else failing is a test failure.
bool prepare(const Template& t, const Case& cs, const Knobs& k, std::vector<Job>& jobs, Stats& st) {
  auto r = t.render(cs.call, k);
  if (!r.is_ok()) {
    EXPECT_EQ(r.status().code(), Code::kUnsupported) << cs.label << ": " << r.status().to_string();
    ++st.unsupported;
    return false;
  }
  ++st.rendered;
  EXPECT_EQ(r->family, t.name());
  auto spec = parse_launch_spec(r->launch);
  EXPECT_TRUE(spec.is_ok()) << cs.label << " " << r->id() << ": " << spec.status().to_string() << "\n" << r->launch.dump();
  if (!spec.is_ok()) return false;
  auto rs = resolve(spec.value(), cs.call.binding());
  EXPECT_TRUE(rs.is_ok()) << cs.label << " " << r->id() << ": " << rs.status().to_string() << "\n" << r->launch.dump();
  if (!rs.is_ok()) return false;
  jobs.push_back({&cs, std::move(r.value()), std::move(rs.value())});
  st.sources.insert(jobs.back().cand.source);
  return true;
}

// Runs a job serially and over threads; checks both against the reference and each other.
void run_job(const Job& j, Buffers& in, const std::vector<Expect>& want, Stats& st) {
  const OpCall& c = j.cs->call;
  const Compiled& bin = compiled(j.cand.source);
  ASSERT_TRUE(bin.ok) << j.cs->label << " " << j.cand.id() << ": " << bin.error << "\n" << j.cand.source;
  auto l = cpu_backend().load(bin.binary, j.spec);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  const Binding b = c.binding();
  std::vector<std::vector<float>> results[2];
  for (int threaded = 0; threaded < 2; ++threaded) {
    Buffers outs;
    std::vector<void*> ptrs;
    for (const auto& t : b.tensors) {
      if (!t.defined) {
        ptrs.push_back(nullptr);
      } else if (in.count(t.name)) {
        ptrs.push_back(in[t.name].data());
      } else {
        outs[t.name].assign(t.numel() * (t.dtype == DType::kI64 ? 2 : 1), NAN);   // int64: two floats an element
        ptrs.push_back(outs[t.name].data());
      }
    }
    std::vector<std::vector<double>> scratch;
    for (int64_t bytes : j.spec.scratch_bytes) {
      scratch.emplace_back((bytes + 7) / 8 + 1, NAN);
      ptrs.push_back(scratch.back().data());
    }
    ExecContext ctx;
    if (threaded) ctx.parallel_for = threaded_for;
    Status s = l.value()->run(ptrs.data(), ctx);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    for (size_t i = 0; i < c.outputs.size(); ++i) {
      if (!c.outputs[i].defined) {
        results[threaded].emplace_back();
        continue;
      }
      std::vector<float> got = outs[c.outputs[i].name];
      if (c.outputs[i].dtype == DType::kI64) {   // indices: their values (exact in float below 2^24)
        std::vector<float> v(got.size() / 2);
        for (size_t e = 0; e < v.size(); ++e) {
          int64_t q;
          std::memcpy(&q, &got[2 * e], 8);
          v[e] = static_cast<float>(q);
        }
        got = std::move(v);
      }
      std::string bad = compare(got, want[i]);
      EXPECT_TRUE(bad.empty()) << j.cs->label << " " << j.cand.id() << (threaded ? " threaded" : " serial") << " out"
                               << i << ":" << bad;
      results[threaded].push_back(got);
    }
  }
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    const auto &a = results[0][i], &bb = results[1][i];
    EXPECT_TRUE(a.size() == bb.size() && (a.empty() || std::memcmp(a.data(), bb.data(), a.size() * 4) == 0))
        << j.cs->label << " " << j.cand.id() << " out" << i << ": serial and threaded results differ";
  }
  ++st.ran;
  for (const auto& [name, v] : j.cand.knobs) st.covered[name].insert(v);
}

}  // namespace

// The CPU template for the case's op (exactly one per call).
const Template* cpu_template(const OpCall& c) {
  std::vector<const Template*> ts = templates_for(c);
  std::vector<const Template*> cpu;
  for (auto* t : ts)
    if (t->backend() == BackendKind::kCpu) cpu.push_back(t);
  EXPECT_EQ(cpu.size(), 1u) << op_info(c.op).name;
  return cpu.size() == 1 ? cpu[0] : nullptr;
}

// Renders, compiles and runs every case with the default knobs and `n_random` random settings.
Stats run_family(const std::vector<Case>& cases, const char* family, int n_random) {
  Stats st;
  Plan plan;
  std::vector<Job> jobs;
  for (const auto& cs : cases) {
    const Template* t = cpu_template(cs.call);
    if (!t) continue;
    EXPECT_STREQ(t->name(), family) << cs.label;
    ++st.cases;
    std::vector<Knobs> ks = knob_sample(*t, cs, plan, n_random);
    auto d = t->render(cs.call, {});
    EXPECT_TRUE(d.is_ok()) << cs.label << ": the default knobs must render: " << d.status().to_string();
    for (const auto& k : ks) prepare(*t, cs, k, jobs, st);
  }
  compile_all(st.sources);
  for (const auto& s : st.sources) {
    const Compiled& c = compiled(s);
    EXPECT_TRUE(c.ok) << c.error << "\n" << s;
    EXPECT_EQ(c.log.find("warning"), std::string::npos) << c.log << "\n" << s;
  }
  const Case* cur = nullptr;
  Buffers in;
  std::vector<Expect> want;
  for (const auto& j : jobs) {
    if (j.cs != cur) {
      cur = j.cs;
      in = make_inputs(*cur);
      want = reference(cur->call, in);
    }
    run_job(j, in, want, st);
  }
  std::printf("[ %s ] %d cases, %d knob settings rendered (%d unsupported), %d run, %zu distinct sources; ran:", family,
              st.cases, st.rendered, st.unsupported, st.ran, st.sources.size());
  for (const auto& [name, vs] : st.covered) {
    std::printf(" %s={", name.c_str());
    for (int64_t v : vs) std::printf("%s%lld", v == *vs.begin() ? "" : ",", static_cast<long long>(v));
    std::printf("}");
  }
  std::printf("\n");
  for (const auto& [name, vs] : st.covered) EXPECT_GE(vs.size(), 2u) << family << ": knob " << name << " ran with one value";
  return st;
}

}  // namespace kc::evolve
