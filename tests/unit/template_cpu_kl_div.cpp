// The KL divergence CPU templates (cpu.kl_div, cpu.kl_div_backward) end to end against torch:
// log_target both ways, every reduction, 1-d, 2-d and 3-d self, sizes that need several blocks
// and a tail, targets with exact zeros (xlogy's 0 log 0 = 0). Per case the default knobs and every
// other value of every knob, one at a time, are rendered, resolved, statically checked,
// host-compiled and run serially and over threads (bit-identical). References are at::kl_div and
// its autograd in fp64 on the same inputs; each result may be off by k ulp of fp32 times the
// conditioning of its formula (the losses' model: evolve/ops/kl_div_reference.cpp). Candidates
// run on torch tensors, as the cross-entropy and RMSNorm tests do.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/ops/eager.h"
#include "evolve/ops/kl_div.h"
#include "evolve/propose/proposer.h"
#include "evolve/verify/static_check.h"
#include "runtime/cpu_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

struct KlCase {
  std::string label;
  std::vector<int64_t> sizes;
  json args;   // reduction, log_target
};

std::vector<KlCase> cases() {
  std::vector<KlCase> v;
  for (bool lt : {false, true})
    for (int64_t r : {0, 1, 2}) {
      const std::string s = std::string(lt ? "log" : "prob") + "/r" + std::to_string(r);
      const json a = {{"reduction", r}, {"log_target", lt}};
      v.push_back({s + "/rows", {37, 11}, a});
      v.push_back({s + "/1d", {1000}, a});
      v.push_back({s + "/3d-many-blocks", {7, 99, 131}, a});
    }
  v.push_back({"prob/r2/one", {1}, {{"reduction", 2}}});
  return v;
}

// A parallel_for over 3 std::threads with uneven parts, as at::parallel_for may split a range.
void threaded_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t cut1 = n / 5, cut2 = n / 5 + (n - n / 5) / 2;
  std::vector<std::thread> ts;
  for (auto [b, e] : {std::pair{int64_t{0}, cut1}, std::pair{cut1, cut2}, std::pair{cut2, n}})
    if (b < e) ts.emplace_back(fn, b, e);
  for (auto& t : ts) t.join();
}

at::Tensor d64(const at::Tensor& t) { return t.to(at::kDouble); }

// self around zero (log-probabilities need not be normalized), target probabilities with one in
// five exactly 0, or log-probabilities -|N(0, 2)|; grad N(0, 1) of the forward output's shape.
std::map<std::string, at::Tensor> make_inputs(const OpCall& c, uint64_t seed) {
  const KlDivGeom g = kl_div_geometry(c).value();
  at::manual_seed(seed);
  std::map<std::string, at::Tensor> in;
  for (const auto& t : c.inputs) {
    if (t.name == "self") in[t.name] = at::randn(t.sizes) * 3;
    if (t.name == "grad") in[t.name] = at::randn(t.sizes);
    if (t.name != "target") continue;
    at::Tensor tg = g.log_target ? at::randn(t.sizes).abs_().mul_(-2) : at::rand(t.sizes);
    if (!g.log_target) tg.view(-1).slice(0, 0, tg.numel(), 5).zero_();
    in[t.name] = tg;
  }
  return in;
}

struct Expected {
  at::Tensor ref, tol;   // fp64, the outputs' sizes
};

constexpr double kUlps = 32 * FLT_EPSILON;

// The terms' condition magnitudes (kl_div_reference.cpp): 2 |t log t| + |t x| + |v|, or 3 |v|;
// a reduction adds them (its partial sums are double or compensated) and divides for the mean.
std::vector<Expected> forward_ref(const OpCall& c, std::map<std::string, at::Tensor>& in) {
  const KlDivGeom g = kl_div_geometry(c).value();
  const at::Tensor x = d64(in.at("self")), t = d64(in.at("target"));
  const at::Tensor v = at::kl_div(x, t, at::Reduction::None, g.log_target);
  const at::Tensor h = g.log_target ? v.abs() * 3 : at::xlogy(t, t).abs() * 2 + (t * x).abs() + v.abs();
  const at::Tensor out = at::kl_div(x, t, static_cast<int64_t>(g.reduction), g.log_target);
  if (g.elementwise()) return {{out, kUlps * h}};
  const double n = g.reduction == LossReduction::kMean ? static_cast<double>(g.terms) : 1.0;
  return {{out, kUlps * h.sum() / n}};
}

// Autograd in fp64 through at::kl_div: -t g or -exp(t) g, a couple of roundings of itself.
std::vector<Expected> backward_ref(const OpCall& c, std::map<std::string, at::Tensor>& in) {
  const KlDivGeom g = kl_div_geometry(c).value();
  c10::AutoGradMode on(true);
  const at::Tensor x = d64(in.at("self")).detach().requires_grad_(true);
  const at::Tensor out = at::kl_div(x, d64(in.at("target")), static_cast<int64_t>(g.reduction), g.log_target);
  const at::Tensor gi = torch::autograd::grad({out}, {x}, {d64(in.at("grad"))})[0];
  return {{gi, kUlps * gi.abs()}};
}

// "" when `got` is within `e`.
std::string compare(const at::Tensor& got, const Expected& e) {
  const at::Tensor y = got.to(at::kDouble).reshape({-1}), r = e.ref.reshape({-1}), tol = e.tol.reshape({-1});
  const at::Tensor bad = ((y - r).abs() <= tol + 1e-37).logical_not().nonzero().reshape({-1});
  std::string msg;
  for (int64_t n = 0; n < std::min<int64_t>(bad.numel(), 4); ++n) {
    const int64_t i = bad[n].item<int64_t>();
    msg += " [" + std::to_string(i) + "] got " + std::to_string(y[i].item<double>()) + " want " +
           std::to_string(r[i].item<double>()) + " (tol " + std::to_string(tol[i].item<double>()) + ")";
  }
  if (bad.numel()) msg += " (" + std::to_string(bad.numel()) + " of " + std::to_string(y.numel()) + " wrong)";
  return msg;
}

struct Job {
  std::string where;
  OpCall call;
  Candidate cand;
  ResolvedSpec spec;
  uint64_t seed;
};

// Runs a job serially and over threads on the inputs; checks both and their equality.
void run_job(const Job& j, const CompileOutput& bin, std::map<std::string, at::Tensor>& in, const std::vector<Expected>& want) {
  auto l = cpu_backend().load(bin.binary, j.spec);
  ASSERT_TRUE(l.is_ok()) << j.where << ": " << l.status().to_string();
  std::vector<at::Tensor> results[2];
  for (int threaded = 0; threaded < 2; ++threaded) {
    std::vector<void*> ptrs;
    std::vector<at::Tensor> outs;
    for (const auto& t : j.call.binding().tensors) {
      if (in.count(t.name)) {
        ptrs.push_back(in[t.name].data_ptr());
      } else {
        outs.push_back(at::full(t.sizes, NAN, at::TensorOptions().dtype(to_scalar_type(t.dtype))));
        ptrs.push_back(outs.back().data_ptr());
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
    ASSERT_TRUE(s.is_ok()) << j.where << ": " << s.to_string();
    ASSERT_EQ(outs.size(), want.size()) << j.where;
    for (size_t o = 0; o < outs.size(); ++o) {
      const std::string bad = compare(outs[o], want[o]);
      EXPECT_TRUE(bad.empty()) << j.where << (threaded ? " threaded" : " serial") << " out" << o << ":" << bad;
    }
    results[threaded] = outs;
  }
  for (size_t o = 0; o < results[0].size(); ++o) {
    const at::Tensor &a = results[0][o], &b = results[1][o];
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << j.where << " out" << o << ": serial and threaded differ";
  }
}

// The single CPU template of a call.
const Template* cpu_template(const OpCall& c) {
  const Template* found = nullptr;
  for (const Template* t : templates_for(c))
    if (t->backend() == BackendKind::kCpu) {
      EXPECT_EQ(found, nullptr) << "two CPU templates claim " << op_info(c.op).name;
      found = t;
    }
  return found;
}

// The default, then each other value of each knob alone.
std::vector<Knobs> settings(const Template& t, const OpCall& c) {
  std::vector<Knobs> v = {Knobs{}};
  for (const auto& d : t.space(c))
    for (size_t i = 1; i < d.values.size(); ++i) v.push_back({{d.name, d.values[i]}});
  return v;
}

TEST(CpuKlDiv, MatchesTorchForEveryKnobAndFlag) {
  const std::vector<KlCase> cs = cases();
  std::vector<Job> jobs;
  std::vector<std::string> sources;
  std::map<std::string, std::set<int64_t>> covered, offered;
  auto add = [&](const std::string& label, OpId op, const KlCase& k, uint64_t seed) {
    auto cr = make_call(op, k.sizes, DType::kF32, BackendKind::kCpu, k.args);
    ASSERT_TRUE(cr.is_ok()) << label << ": " << cr.status().to_string();
    const Template* t = cpu_template(cr.value());
    ASSERT_NE(t, nullptr) << label;
    for (const auto& d : t->space(cr.value())) offered[std::string(t->name()) + "." + d.name].insert(d.values.begin(), d.values.end());
    for (const Knobs& kn : settings(*t, cr.value())) {
      auto r = t->render(cr.value(), kn);
      ASSERT_TRUE(r.is_ok()) << label << ": " << r.status().to_string();
      const std::string where = label + " " + r->id();
      auto spec = parse_launch_spec(r->launch);
      ASSERT_TRUE(spec.is_ok()) << where << ": " << spec.status().to_string();
      auto rs = resolve(spec.value(), cr.value().binding());
      ASSERT_TRUE(rs.is_ok()) << where << ": " << rs.status().to_string() << "\n" << r->launch.dump();
      const StaticReport rep = static_check(r->source, cr.value());
      EXPECT_TRUE(rep.ok() && rep.findings.empty()) << where << ": " << rep.to_json().dump(1);
      if (std::find(sources.begin(), sources.end(), r->source) == sources.end()) sources.push_back(r->source);
      for (const auto& [n, v] : r->knobs) covered[std::string(t->name()) + "." + n].insert(v);
      jobs.push_back({where, cr.value(), r.value(), rs.value(), seed});
    }
  };
  for (size_t i = 0; i < cs.size(); ++i) {
    add(cs[i].label, OpId::kKlDiv, cs[i], 100 + i);
    add(cs[i].label + "/backward", OpId::kKlDivBackward, cs[i], 100 + i);
  }
  std::map<std::string, Result<CompileOutput>> bins;
  for (const auto& src : sources) {
    auto bin = cpu_backend().compile(src);
    ASSERT_TRUE(bin.is_ok()) << bin.status().to_string() << "\n" << src;
    EXPECT_EQ(bin->log.find("warning"), std::string::npos) << bin->log << "\n" << src;
    bins.emplace(src, std::move(bin));
  }
  for (const Job& j : jobs) {
    std::map<std::string, at::Tensor> in = make_inputs(j.call, j.seed);
    const std::vector<Expected> want = j.call.op == OpId::kKlDiv ? forward_ref(j.call, in) : backward_ref(j.call, in);
    run_job(j, bins.at(j.cand.source).value(), in, want);
  }
  std::printf("[ kl_div ] %zu cases, %zu runs, %zu sources\n", cs.size(), jobs.size(), sources.size());
  for (const auto& [n, vs] : offered) EXPECT_EQ(covered[n], vs) << n << ": some values never ran";
}

// Calls the templates leave to eager (reduced precision, CUDA calls, a transposed self, a
// target of another shape or dtype), knob misuse, and what a NaN or zero target gives.
TEST(CpuKlDiv, ScopeAndKnobs) {
  auto claimed = [](const OpCall& c) {
    for (const Template* t : cpu_templates())
      if (!t->space(c).empty()) return true;
    return false;
  };
  auto call = [](OpId op, DType dt, const json& a) {
    auto c = make_call(op, {8, 16}, dt, BackendKind::kCpu, a);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.value();
  };
  for (OpId op : {OpId::kKlDiv, OpId::kKlDivBackward}) {
    EXPECT_TRUE(claimed(call(op, DType::kF32, json::object())));
    EXPECT_FALSE(claimed(call(op, DType::kBF16, json::object())));
    OpCall cuda = call(op, DType::kF32, json::object());
    cuda.backend = BackendKind::kCuda;
    EXPECT_FALSE(claimed(cuda));
    OpCall tr = call(op, DType::kF32, json::object());
    for (auto& t : tr.inputs)
      if (t.name == "self") t.strides = {1, 8};
    EXPECT_FALSE(claimed(tr));
    OpCall bc = call(op, DType::kF32, json::object());
    for (auto& t : bc.inputs)
      if (t.name == "target") t.sizes = {1, 16};
    EXPECT_FALSE(kl_div_geometry(bc).is_ok());
  }
  const OpCall f = call(OpId::kKlDiv, DType::kF32, {{"reduction", 2}});
  const Template* t = cpu_template(f);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->render(f, {{"warp", 1}}).status().code(), Code::kUnsupported);
  EXPECT_EQ(t->render(f, {{"unroll", 3}}).status().code(), Code::kUnsupported);
  auto r = t->render(f, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->knobs.size(), t->space(f).size());
  EXPECT_NE(r->launch.dump().find("kc_part"), std::string::npos);   // reduced: partials, then a final launch
  // xlogy's semantics, through the elementwise render: 0 where t == 0, NaN where t is NaN.
  const OpCall m = call(OpId::kKlDiv, DType::kF32, {{"reduction", 0}});
  auto rm = cpu_template(m)->render(m, {});
  ASSERT_TRUE(rm.is_ok());
  auto bin = cpu_backend().compile(rm->source);
  ASSERT_TRUE(bin.is_ok()) << bin.status().to_string();
  auto rs = resolve(parse_launch_spec(rm->launch).value(), m.binding());
  ASSERT_TRUE(rs.is_ok());
  auto l = cpu_backend().load(bin->binary, rs.value());
  ASSERT_TRUE(l.is_ok());
  at::Tensor x = at::full({8, 16}, 2.f), tg = at::full({8, 16}, 0.5f), out = at::empty({8, 16});
  tg[0][0] = 0.f;
  tg[0][1] = NAN;
  std::map<std::string, void*> by_name = {{"self", x.data_ptr()}, {"target", tg.data_ptr()}, {"out0", out.data_ptr()}};
  std::vector<void*> ptrs;
  for (const auto& bt : m.binding().tensors) ptrs.push_back(by_name.at(bt.name));
  ASSERT_TRUE(l.value()->run(ptrs.data(), ExecContext{}).is_ok());
  const at::Tensor want = at::kl_div(x, tg, at::Reduction::None, false);
  EXPECT_EQ(out[0][0].item<float>(), 0.f);
  EXPECT_TRUE(std::isnan(out[0][1].item<float>()));
  EXPECT_TRUE(at::allclose(out.slice(1, 2), want.slice(1, 2)));
}

}  // namespace
}  // namespace kc::evolve
