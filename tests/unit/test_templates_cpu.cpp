// CPU op-family templates end to end (no GPU): for every op, several shapes (odd ones included),
// the template's default knobs plus pseudo-random knob settings are rendered, the launch spec is
// parsed and resolved against the call's binding, the source is compiled with the host compiler
// (once per distinct source text), loaded and run on real buffers, serially and over threads.
// Outputs start as NaN so unwritten elements show; results are compared with double-precision
// references (template_cpu_reference.cpp), and serial and threaded runs must agree bit for bit
// (every reduction has a fixed order). A cheaper sweep renders many more knob settings without
// compiling them.
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
#include "tests/unit/template_cpu_reference.h"

namespace kc::evolve {
namespace {

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
struct Compiled {
  bool ok = false;
  std::string binary, log, error;
};
std::mutex g_compile_mu;
std::map<std::string, Compiled> g_compiled;
int g_compiles = 0;

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

// ---------------------------------------------------------------------------------------------
// Calls and their data.

struct Case {
  std::string label;
  OpCall call;
  double offset = 0;    // added to the main input (softmax / layer norm): exercises max subtraction,
                        // cancellation in the moments
  bool nan_row = false; // softmax: one element of row 3 is NaN
};

OpCall must(Result<OpCall> r) {
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r.value()) : OpCall{};
}

OpCall cpu_call(OpId op, std::vector<int64_t> sizes, json args = json::object()) {
  return must(make_call(op, sizes, DType::kF32, BackendKind::kCpu, args));
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out.empty() ? "scalar" : out;
}

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
    if ((t.name == "self" && fam == OpFamily::kSoftmax) || (t.name == "input" && fam == OpFamily::kLayerNorm)) {
      for (auto& x : v) x = 2.f * x + static_cast<float>(cs.offset);
      if (cs.nan_row) v[3 * t.sizes.back() + 17] = NAN;
    }
  }
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

struct Stats {
  int cases = 0, rendered = 0, unsupported = 0, ran = 0;
  std::set<std::string> sources;
  std::map<std::string, std::set<int64_t>> covered;   // knob -> values that ran
  // True when some run had knob != 0 (mode on) and some run had knob == 0.
  bool both(const std::string& knob) const {
    auto it = covered.find(knob);
    return it != covered.end() && it->second.count(0) && it->second.size() >= 2;
  }
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
        outs[t.name].assign(t.numel(), NAN);
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
      const auto& got = outs[c.outputs[i].name];
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
Stats run_family(const std::vector<Case>& cases, const char* family, int n_random = 6) {
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

// ---------------------------------------------------------------------------------------------
// Cases.

const std::vector<std::vector<int64_t>> kShapes = {{1}, {1, 1}, {3, 37}, {7, 1000}, {2, 4097}, {5, 3, 17}, {300007}};

std::vector<Case> unary_cases() {
  std::vector<Case> v;
  for (const auto& s : kShapes) {
    for (OpId op : {OpId::kRelu, OpId::kSilu, OpId::kSigmoid, OpId::kTanh})
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s)});
    for (const char* a : {"none", "tanh"})
      v.push_back({std::string("gelu-") + a + "/" + shape_str(s), cpu_call(OpId::kGelu, s, {{"approximate", a}})});
  }
  return v;
}

std::vector<Case> unary_backward_cases() {
  std::vector<Case> v;
  for (const auto& s : kShapes) {
    for (OpId op : {OpId::kSiluBackward, OpId::kSigmoidBackward, OpId::kTanhBackward})
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s)});
    for (const char* a : {"none", "tanh"})
      v.push_back({std::string("gelu_backward-") + a + "/" + shape_str(s),
                   cpu_call(OpId::kGeluBackward, s, {{"approximate", a}})});
    v.push_back({"threshold_backward-i0/" + shape_str(s), cpu_call(OpId::kReluBackward, s, {{"threshold", 0}})});
    v.push_back({"threshold_backward-d0.5/" + shape_str(s), cpu_call(OpId::kReluBackward, s, {{"threshold", 0.5}})});
  }
  return v;
}

std::vector<Case> softmax_cases(bool backward) {
  std::vector<Case> v;
  const std::vector<std::pair<std::vector<int64_t>, double>> shapes = {
      {{1, 1}, 0}, {{1}, 0}, {{3, 37}, 0}, {{7, 1000}, 100}, {{2, 4097}, 0}, {{5, 3, 17}, 0}, {{64, 33}, -20}, {{2, 70001}, 0}};
  for (const auto& [s, off] : shapes) {
    for (OpId op : backward ? std::vector<OpId>{OpId::kSoftmaxBackward, OpId::kLogSoftmaxBackward}
                            : std::vector<OpId>{OpId::kSoftmax, OpId::kLogSoftmax}) {
      const int64_t dim = s.size() == 2 && s[0] == 7 ? 1 : -1;   // a positive last dim too
      v.push_back({std::string(op_info(op).name) + "/" + shape_str(s), cpu_call(op, s, {{"dim", dim}}), off});
    }
  }
  return v;
}

struct LnShape {
  std::vector<int64_t> sizes, normalized;
  double offset;
};
const std::vector<LnShape> kLnShapes = {
    {{1, 1}, {1}, 0.5},          {{3, 37}, {37}, 0.5},       {{7, 1000}, {1000}, 100},  {{2, 4097}, {4097}, 0.5},
    {{2, 3, 5, 7}, {5, 7}, 0.5}, {{100, 64}, {64}, -3},      {{2, 300000}, {300000}, 0.5},   // split by default
    {{1, 3, 70001}, {3, 70001}, 4}};

std::vector<Case> layer_norm_cases() {
  std::vector<Case> v;
  for (const auto& s : kLnShapes) {
    const std::string sh = shape_str(s.sizes) + "/ns" + shape_str(s.normalized);
    v.push_back({"layer_norm-wb/" + sh, cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}}), s.offset});
    v.push_back({"layer_norm-none/" + sh,
                 cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}, {"affine", false}}), s.offset});
    v.push_back({"layer_norm-w/" + sh,
                 cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}, {"bias", false}}), s.offset});
    Case b{"layer_norm-b/" + sh, cpu_call(OpId::kLayerNorm, s.sizes, {{"normalized_shape", s.normalized}}), s.offset};
    for (auto& t : b.call.inputs)
      if (t.name == "weight") {
        t.defined = false;
        t.sizes.clear();
        t.strides.clear();
      }
    v.push_back(b);
  }
  // The brief's large case: M=1, N=4M (split rows by default).
  v.push_back({"layer_norm-wb/1x64x256x256",
               cpu_call(OpId::kLayerNorm, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}}), 1.0});
  return v;
}

std::vector<Case> layer_norm_backward_cases() {
  std::vector<Case> v;
  for (const auto& s : kLnShapes) {
    const std::string sh = shape_str(s.sizes) + "/ns" + shape_str(s.normalized);
    auto mk = [&](const char* tag, json args) {
      args["normalized_shape"] = s.normalized;
      v.push_back({std::string("layer_norm_backward-") + tag + "/" + sh, cpu_call(OpId::kLayerNormBackward, s.sizes, args)});
    };
    mk("wb-111", json::object());
    mk("wb-100", {{"output_mask", {1, 0, 0}}});
    mk("wb-011", {{"output_mask", {0, 1, 1}}});
    mk("w-110", {{"bias", false}, {"output_mask", {1, 1, 0}}});
    mk("none-100", {{"affine", false}, {"output_mask", {1, 0, 0}}});
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Tests.

TEST(CpuTemplates, Unary) {
  Stats st = run_family(unary_cases(), "cpu.unary");
  EXPECT_GT(st.ran, 200);
  EXPECT_TRUE(st.both("vexp"));
}

TEST(CpuTemplates, UnaryBackward) {
  Stats st = run_family(unary_backward_cases(), "cpu.unary_backward");
  EXPECT_GT(st.ran, 200);
  EXPECT_TRUE(st.both("vexp"));
}

TEST(CpuTemplates, Softmax) {
  std::vector<Case> cases = softmax_cases(false);
  // A row holding NaN turns the whole row into NaN, as PyTorch's softmax does.
  for (OpId op : {OpId::kSoftmax, OpId::kLogSoftmax}) {
    Case c{std::string(op_info(op).name) + "/nan-row/9x100", cpu_call(op, {9, 100}), 0, true};
    cases.push_back(c);
  }
  Stats st = run_family(cases, "cpu.softmax");
  EXPECT_GT(st.ran, 80);
  for (const char* k : {"acc", "vexp"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, SoftmaxBackward) {
  Stats st = run_family(softmax_cases(true), "cpu.softmax_backward");
  EXPECT_GT(st.ran, 80);
  for (const char* k : {"acc", "vexp"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, LayerNorm) {
  Stats st = run_family(layer_norm_cases(), "cpu.layer_norm");
  EXPECT_GT(st.ran, 150);
  for (const char* k : {"split", "acc", "stats"}) EXPECT_TRUE(st.both(k)) << k;
}

TEST(CpuTemplates, LayerNormBackward) {
  Stats st = run_family(layer_norm_backward_cases(), "cpu.layer_norm_backward");
  EXPECT_GT(st.ran, 150);
  for (const char* k : {"split", "wb_rows", "acc"}) EXPECT_TRUE(st.both(k)) << k;
}

// Every knob setting of the space renders (or is kUnsupported), its spec parses and resolves
// against the binding, names only entries the source defines and only tensors that are present,
// and the source passes the static check. Up to 160 settings per call, no compiling.
TEST(CpuTemplates, EveryKnobSettingRendersOrIsUnsupported) {
  std::vector<Case> all;
  for (auto* f : {&unary_cases, &unary_backward_cases, &layer_norm_cases, &layer_norm_backward_cases})
    for (auto& c : (*f)()) all.push_back(std::move(c));
  for (bool bw : {false, true})
    for (auto& c : softmax_cases(bw)) all.push_back(std::move(c));
  int rendered = 0, unsupported = 0;
  std::set<std::string> checked;   // static check once per source
  for (const auto& cs : all) {
    if (cs.call.inputs.empty() || cs.call.inputs[0].numel() > (1 << 20)) continue;   // the big case: sizes only matter in specs
    const Template* t = cpu_template(cs.call);
    if (!t) continue;
    std::vector<KnobDim> space = t->space(cs.call);
    ASSERT_FALSE(space.empty());
    size_t total = 1;
    for (const auto& d : space) {
      ASSERT_FALSE(d.values.empty()) << d.name;
      std::set<int64_t> uniq(d.values.begin(), d.values.end());
      EXPECT_EQ(uniq.size(), d.values.size()) << cs.label << " knob " << d.name << " repeats a value";
      total *= d.values.size();
    }
    std::mt19937_64 rng(fnv(cs.label));
    const size_t count = std::min<size_t>(total, 160);
    for (size_t i = 0; i < count; ++i) {
      Knobs k;
      size_t idx = total <= 160 ? i : rng() % total;
      for (const auto& d : space) {
        k[d.name] = d.values[idx % d.values.size()];
        idx /= d.values.size();
      }
      auto r = t->render(cs.call, k);
      if (!r.is_ok()) {
        EXPECT_EQ(r.status().code(), Code::kUnsupported) << cs.label << ": " << r.status().to_string();
        ++unsupported;
        continue;
      }
      ++rendered;
      EXPECT_EQ(r->knobs, k) << cs.label;
      auto spec = parse_launch_spec(r->launch);
      ASSERT_TRUE(spec.is_ok()) << cs.label << " " << r->id() << ": " << spec.status().to_string();
      auto rs = resolve(spec.value(), cs.call.binding());
      ASSERT_TRUE(rs.is_ok()) << cs.label << " " << r->id() << ": " << rs.status().to_string();
      for (const auto& l : spec->launches)
        EXPECT_NE(r->source.find("extern \"C\" void " + l.entry + "("), std::string::npos) << l.entry;
      if (checked.insert(r->source).second) {
        StaticReport rep = static_check(r->source, BackendKind::kCpu, "fp32", {"f32"}, cs.call.inputs[0].numel());
        EXPECT_TRUE(rep.ok()) << cs.label << " " << r->id() << ": " << rep.to_json().dump(2);
        EXPECT_TRUE(rep.findings.empty()) << rep.to_json().dump(2);
      }
    }
  }
  std::printf("[ sweep ] %d settings rendered, %d unsupported, %zu distinct sources statically checked\n", rendered,
              unsupported, checked.size());
  EXPECT_GT(rendered, 4000);
}

// Calls the CPU templates must leave alone (eager runs them), and knob misuse.
TEST(CpuTemplates, ScopeAndKnobChecks) {
  auto first_space = [](const OpCall& c) {
    for (const Template* t : cpu_templates())
      if (!t->space(c).empty()) return std::string(t->name());
    return std::string();
  };
  OpCall ok = cpu_call(OpId::kRelu, {4, 8});
  EXPECT_EQ(first_space(ok), "cpu.unary");
  OpCall cuda = must(make_call(OpId::kRelu, {4, 8}, DType::kF32, BackendKind::kCuda));
  EXPECT_EQ(first_space(cuda), "");
  OpCall f64 = must(make_call(OpId::kRelu, {4, 8}, DType::kF64, BackendKind::kCpu));
  EXPECT_EQ(first_space(f64), "");
  OpCall strided = ok;
  strided.inputs[0].strides = {1, 4};   // transposed
  EXPECT_EQ(first_space(strided), "");
  OpCall misaligned = ok;
  misaligned.inputs[0].align = 4;
  EXPECT_EQ(first_space(misaligned), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kGelu, {4, 8}, {{"approximate", "erf"}})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kSoftmax, {4, 8}, {{"dim", 0}})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kSoftmax, {4, 8}, {{"dim", -2}})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kSoftmax, {4, 8}, {{"dim", 1}})), "cpu.softmax");
  OpCall h2f = cpu_call(OpId::kSoftmax, {4, 8});
  for (auto& s : h2f.scalars)
    if (s.name == "half_to_float") s.value = true;
  EXPECT_EQ(first_space(h2f), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kRelu, {0, 8})), "");
  EXPECT_EQ(first_space(cpu_call(OpId::kLayerNorm, {4, 8}, {{"normalized_shape", {8}}})), "cpu.layer_norm");

  const Template* t = cpu_template(ok);
  ASSERT_TRUE(t);
  auto bad_name = t->render(ok, {{"warp", 4}});
  EXPECT_EQ(bad_name.status().code(), Code::kUnsupported);
  auto bad_value = t->render(ok, {{"unroll", 3}});
  EXPECT_EQ(bad_value.status().code(), Code::kUnsupported);
  auto not_handled = t->render(cuda, {});
  EXPECT_EQ(not_handled.status().code(), Code::kUnsupported);
  auto d = t->render(ok, {});
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->knobs.size(), t->space(ok).size());   // every knob named, defaults filled in
  EXPECT_EQ(d->id(), t->render(ok, d->knobs)->id());

  // One-pass moments need double accumulation.
  OpCall ln = cpu_call(OpId::kLayerNorm, {4, 8}, {{"normalized_shape", {8}}});
  const Template* lt = cpu_template(ln);
  ASSERT_TRUE(lt);
  EXPECT_EQ(lt->render(ln, {{"stats", 1}, {"acc", 0}}).status().code(), Code::kUnsupported);
  EXPECT_TRUE(lt->render(ln, {{"stats", 1}, {"acc", 1}}).is_ok());

  // Absent optionals are never named in the spec; masked-out gradients are not written.
  OpCall lnb = cpu_call(OpId::kLayerNormBackward, {4, 8}, {{"normalized_shape", {8}}, {"affine", false}, {"output_mask", {1, 0, 0}}});
  const Template* bt = cpu_template(lnb);
  ASSERT_TRUE(bt);
  auto r = bt->render(lnb, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const std::string spec = r->launch.dump();
  for (const char* absent : {"ptr:weight", "ptr:bias", "ptr:out1", "ptr:out2"})
    EXPECT_EQ(spec.find(absent), std::string::npos) << absent << " in " << spec;
  OpCall lnf = cpu_call(OpId::kLayerNorm, {4, 8}, {{"normalized_shape", {8}}, {"affine", false}});
  auto rf = cpu_template(lnf)->render(lnf, {});
  ASSERT_TRUE(rf.is_ok());
  EXPECT_EQ(rf->launch.dump().find("ptr:weight"), std::string::npos);
  EXPECT_EQ(rf->launch.dump().find("ptr:bias"), std::string::npos);
}

// The inline exp of vexp=1 (taken from a rendered source) against exp in double, over the whole
// float range where exp is neither 0 nor inf, the overflow and denormal edges, and specials.
TEST(CpuTemplates, InlineExpWithinTwoUlp) {
  OpCall c = cpu_call(OpId::kSigmoid, {16});
  auto r = cpu_template(c)->render(c, {{"vexp", 1}});
  ASSERT_TRUE(r.is_ok());
  ASSERT_NE(r->source.find("kc_exp"), std::string::npos);
  const std::string src = r->source + R"K(
extern "C" void kc_test_exp(const kc_cpu_ctx* ctx, void* const* args) {
  float* o = KC_ARG(float*, args, 0);
  const float* x = KC_ARG(const float*, args, 1);
  const int64_t n = KC_ARG(int64_t, args, 2);
  for (int64_t b = ctx->begin; b < ctx->end; ++b)
    for (int64_t i = b * 4096; i < n && i < (b + 1) * 4096; ++i) o[i] = kc_exp(x[i]);
}
)K";
  std::vector<float> x;
  for (float v = -106.f; v <= 90.f; v += 1.9e-4f) x.push_back(v);
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 88.72283f, 88.72284f, -87.33654f, -103.2789f, -103.9720f, INFINITY,
                  -INFINITY, NAN})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> o(n, NAN);
  Binding b;
  TensorMeta tx, to;
  tx.name = "self", tx.sizes = {n}, tx.strides = {1};
  to.name = "out0", to.sizes = {n}, to.strides = {1};
  b.tensors = {tx, to};
  auto spec = parse_launch_spec(json{{"launches", {{{"entry", "kc_test_exp"}, {"grid", {"ceil_div(numel(self), 4096)"}},
                                                    {"block", {1}}, {"args", {"ptr:out0", "ptr:self", "i64:numel(self)"}}}}}});
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  auto rs = resolve(spec.value(), b);
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  auto bin = cpu_backend().compile(src);
  ASSERT_TRUE(bin.is_ok()) << bin.status().to_string();
  auto l = cpu_backend().load(bin->binary, rs.value());
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  void* ptrs[] = {x.data(), o.data()};
  ExecContext ctx;
  ctx.parallel_for = threaded_for;
  ASSERT_TRUE(l.value()->run(ptrs, ctx).is_ok());
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, 4);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  int64_t worst = 0, bad = 0;
  float worst_x = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(o[i]));
      continue;
    }
    const int64_t ulp = std::llabs(ordered(o[i]) - ordered(want));
    if (ulp > worst) worst = ulp, worst_x = x[i];
    if (ulp > 2 && bad++ < 5) ADD_FAILURE() << "exp(" << x[i] << ") = " << o[i] << ", want " << want << " (" << ulp << " ulp)";
  }
  std::printf("[ kc_exp ] %lld values, worst %lld ulp at x=%g\n", static_cast<long long>(n), static_cast<long long>(worst),
              worst_x);
  EXPECT_EQ(bad, 0);
}

// Split-row layer norm is the default where there are few long rows, and uses two launches and a
// scratch buffer; short rows stay one launch.
TEST(CpuTemplates, LayerNormSplitsLongRows) {
  OpCall big = cpu_call(OpId::kLayerNorm, {1, 64, 256, 256}, {{"normalized_shape", {64, 256, 256}}});
  const Template* t = cpu_template(big);
  ASSERT_TRUE(t);
  auto r = t->render(big, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_NE(r->knobs.at("split"), 0);
  EXPECT_EQ(r->launch["launches"].size(), 2u);
  ASSERT_TRUE(r->launch.contains("scratch"));
  auto spec = parse_launch_spec(r->launch);
  ASSERT_TRUE(spec.is_ok());
  auto rs = resolve(spec.value(), big.binding());
  ASSERT_TRUE(rs.is_ok()) << rs.status().to_string();
  EXPECT_GE(rs->launches[0].grid[0], 16);   // enough blocks for the threads
  OpCall small = cpu_call(OpId::kLayerNorm, {4096, 768}, {{"normalized_shape", {768}}});
  auto s = t->render(small, {});
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->knobs.at("split"), 0);
  EXPECT_EQ(s->launch["launches"].size(), 1u);
  // Work splits live in the launch spec only: one compiled source serves them all.
  auto unsplit = t->render(big, {{"split", 0}, {"rows", 1}});
  ASSERT_TRUE(unsplit.is_ok());
  EXPECT_EQ(unsplit->source, r->source);
  EXPECT_EQ(s->source, r->source);
  EXPECT_NE(unsplit->launch, r->launch);
}

}  // namespace
}  // namespace kc::evolve
