// The cross-entropy CPU templates (cpu.cross_entropy, cpu.cross_entropy_backward) end to end
// against torch: for class and probability targets, weights (fp32 beside bf16 under upcast),
// label smoothing, ignore_index (every row ignored too), an out-of-range target, every reduction,
// 1-d and 2-d self in f32 and bf16, the default knobs and one alternative setting are rendered,
// resolved, statically checked, host-compiled and run serially and over threads (bit-identical).
// References are at::cross_entropy_loss and its autograd in fp64 on the same (rounded) inputs,
// lse at::logsumexp; each element may be off by k ulp of fp32 times the conditioning of its
// formula, plus one rounding of a bf16 output. The harness of template_cpu_harness.h holds fp32
// buffers only, so this file runs its candidates on torch tensors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/ops/cross_entropy.h"
#include "evolve/ops/eager.h"
#include "evolve/propose/proposer.h"
#include "evolve/verify/static_check.h"
#include "runtime/cpu_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

struct CeCase {
  std::string label;
  std::vector<int64_t> sizes;
  DType dt;
  json args;
  bool all_ignored = false, bad_target = false;   // every target ignore_index; row 1 out of range
};

// Every flag of the templates at least once (weighted, probabilities, smoothing, each reduction,
// 1-d, bf16 with and without upcast), rows that need several blocks, a 20000-class row.
std::vector<CeCase> cases() {
  const json w = {{"weight", true}};
  auto with = [](json a, const json& b) {
    a.update(b);
    return a;
  };
  std::vector<CeCase> v;
  for (int64_t r : {0, 1, 2}) {
    const json red = {{"reduction", r}};
    const std::string rs = "/r" + std::to_string(r);
    v.push_back({"class" + rs, {37, 11}, DType::kF32, with(red, {{"ignore_index", 3}})});
    v.push_back({"class-w-smooth" + rs, {37, 11}, DType::kF32, with(red, {{"weight", true}, {"label_smoothing", 0.1}, {"ignore_index", 3}})});
    v.push_back({"probs-w-smooth" + rs, {9, 130}, DType::kF32, with(red, {{"probs", true}, {"weight", r != 2}, {"label_smoothing", 0.2}})});
    v.push_back({"1d-class-w" + rs, {7}, DType::kF32, with(red, w)});
    v.push_back({"bf16-class-w-smooth" + rs, {37, 11}, DType::kBF16, with(red, {{"weight", true}, {"label_smoothing", 0.1}})});
  }
  v.push_back({"probs/r0", {9, 130}, DType::kF32, {{"probs", true}, {"reduction", 0}}});
  v.push_back({"1d-probs/r2", {7}, DType::kF32, {{"probs", true}, {"reduction", 2}}});
  v.push_back({"bf16-class/r1", {5, 1000}, DType::kBF16, {{"reduction", 1}}});
  v.push_back({"bf16-upcast-probs-w/r1", {9, 130}, DType::kBF16, {{"probs", true}, {"weight", true}, {"upcast", true}}});
  v.push_back({"bf16-upcast-class-w-smooth/r0", {37, 11}, DType::kBF16,
               {{"weight", true}, {"label_smoothing", 0.3}, {"upcast", true}, {"reduction", 0}}});
  v.push_back({"long-rows-smooth/r1", {3, 20000}, DType::kF32, {{"label_smoothing", 0.05}, {"weight", true}}});
  for (int64_t r : {0, 1}) {
    v.push_back({"all-ignored/r" + std::to_string(r), {4, 6}, DType::kF32, {{"reduction", r}, {"ignore_index", 0}}, true});
    v.push_back({"bad-target/r" + std::to_string(r), {6, 5}, DType::kF32, {{"reduction", r}}, false, true});
  }
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

// The inputs by name: logits around per-row offsets (one row far from zero, one -inf logit),
// targets with ignored rows, softmax probabilities, positive weights, the loss's gradient and
// the forward's lse (backward).
std::map<std::string, at::Tensor> make_inputs(const CeCase& k, const OpCall& c, uint64_t seed) {
  const CrossEntropyGeom g = cross_entropy_geometry(c).value();
  at::manual_seed(seed);
  std::map<std::string, at::Tensor> in;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor x = at::randn({g.rows, g.classes}, f64) * 3;
  if (g.rows > 1) x[1] += 40;
  // A -inf logit makes a smoothed or probability row's loss +inf: only where the loss stays finite.
  const bool minus_inf = g.classes > 1 && g.rows > 2 && (g.backward || (!g.probs && g.label_smoothing == 0));
  if (minus_inf) x[2][g.classes - 1] = -INFINITY;
  for (const auto& t : c.inputs) {
    if (!t.defined) continue;
    const at::ScalarType st = to_scalar_type(t.dtype);
    if (t.name == "self") {
      in[t.name] = x.reshape(t.sizes).to(st);
    } else if (t.name == "target" && g.probs) {
      in[t.name] = at::softmax(at::randn({g.rows, g.classes}, f64), -1).reshape(t.sizes).to(st);
    } else if (t.name == "target") {
      at::Tensor cls = at::randint(g.classes, {g.rows}, at::TensorOptions().dtype(at::kLong));
      for (int64_t r = 3; r < g.rows; r += 5) cls[r] = g.ignore_index;
      if (minus_inf && cls[2].item<int64_t>() == g.classes - 1) cls[2] = 0;
      if (k.all_ignored) cls.fill_(g.ignore_index);
      if (k.bad_target) cls[1] = g.classes + 2;
      in[t.name] = cls.reshape(t.sizes);
    } else if (t.name == "weight") {
      in[t.name] = (at::rand({g.classes}, f64) + 0.1).to(st);
    } else if (t.name == "grad") {
      in[t.name] = at::randn(t.sizes, f64).to(st);
    } else if (t.name == "lse") {
      in[t.name] = at::logsumexp(in.at("self").to(at::kFloat), {-1});
    }
  }
  return in;
}

struct Expected {
  at::Tensor ref, tol;   // fp64, the outputs' sizes
};

at::Tensor d64(const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; }

// The torch loss on fp64 inputs, self as [rows, C] (a 1-d self is one row: the same loss); a bad
// target is replaced by class 0, its row set to NaN by the caller.
at::Tensor torch_loss(const CeCase& k, const CrossEntropyGeom& g, const at::Tensor& x,
                      std::map<std::string, at::Tensor>& in, int64_t reduction) {
  at::Tensor t = g.probs ? d64(in.at("target")).reshape({g.rows, g.classes}) : in.at("target").reshape({g.rows}).clone();
  if (k.bad_target) t[1] = 0;
  return at::cross_entropy_loss(x, t, in.count("weight") ? d64(in.at("weight")) : at::Tensor(), reduction,
                                g.ignore_index, g.label_smoothing);
}

constexpr double kUlps = 32 * FLT_EPSILON;

// One rounding of a bf16 result (half its ulp), relative to the value.
double out_round(DType d) { return d == DType::kBF16 ? std::ldexp(1.0, -8) : 0.0; }

at::Tensor weight_row(const CrossEntropyGeom& g, std::map<std::string, at::Tensor>& in, const at::TensorOptions& o) {
  return in.count("weight") ? d64(in.at("weight")).reshape({1, -1}) : at::ones({1, g.classes}, o);
}

// Each row's weight in the mean's D: w_t, 0 where ignored (probabilities: 1).
at::Tensor row_weight(const CrossEntropyGeom& g, std::map<std::string, at::Tensor>& in, const at::TensorOptions& o) {
  if (g.probs) return at::ones({g.rows, 1}, o);
  const at::Tensor t = in.at("target").reshape({g.rows, 1});
  const at::Tensor keep = t.ne(g.ignore_index).to(at::kDouble);
  return weight_row(g, in, o).expand({g.rows, g.classes}).gather(1, t.clamp(0, g.classes - 1)) * keep;
}

// Per-row magnitudes h of the loss's terms (the condition of their formula): class
// w_t (|lse| + |x_t|) + (e / C) (W |lse| + sum |w x|), probabilities sum w q (|lse| + |x|).
at::Tensor row_scale(const CrossEntropyGeom& g, const at::Tensor& x, std::map<std::string, at::Tensor>& in) {
  const double e = g.label_smoothing, C = static_cast<double>(g.classes);
  const at::Tensor w = weight_row(g, in, x.options());
  const at::Tensor lse = at::logsumexp(x, {1}, true).abs(), ax = x.abs().nan_to_num(0, 0, 0);
  if (g.probs) {
    at::Tensor q = d64(in.at("target")).reshape({g.rows, g.classes}) * (1 - e) + e / C;
    return ((w * q) * (lse + ax)).sum(1);
  }
  const at::Tensor t = in.at("target").reshape({g.rows, 1}).clamp(0, g.classes - 1);
  const at::Tensor wt = w.expand({g.rows, g.classes}).gather(1, t);
  return (wt * (lse + ax.gather(1, t)) + (e / C) * (w.sum() * lse + (w * ax).sum(1, true))).reshape({g.rows});
}

std::vector<Expected> forward_ref(const CeCase& k, const OpCall& c, std::map<std::string, at::Tensor>& in) {
  const CrossEntropyGeom g = cross_entropy_geometry(c).value();
  const at::Tensor x = d64(in.at("self")).reshape({g.rows, g.classes});
  at::Tensor terms = torch_loss(k, g, x, in, 0).reshape({g.rows});
  if (k.bad_target) terms[1] = NAN;
  const at::Tensor h = row_scale(g, x, in) + terms.abs().nan_to_num(0, 0, 0);
  Expected loss;
  if (g.per_row() || (g.one_d && g.reduction == LossReduction::kNone)) {
    loss.ref = terms;
    loss.tol = kUlps * h;
  } else {
    loss.ref = torch_loss(k, g, x, in, static_cast<int64_t>(g.reduction));
    if (k.bad_target) loss.ref.fill_(NAN);
    loss.tol = kUlps * h.sum();
    if (g.reduction == LossReduction::kMean)   // over D, which has its own rounding
      loss.tol = kUlps * (h.sum() / row_weight(g, in, x.options()).sum().abs() + loss.ref.abs());
  }
  loss.tol = loss.tol + out_round(c.outputs[0].dtype) * loss.ref.abs();
  const at::Tensor lse = at::logsumexp(x, {1});
  Expected l{lse, kUlps * (lse.abs() + std::get<0>(x.max(1)).abs() + 1)};
  loss.ref = loss.ref.reshape(c.outputs[0].sizes), loss.tol = loss.tol.reshape(c.outputs[0].sizes);
  l.ref = l.ref.reshape(c.outputs[1].sizes), l.tol = l.tol.reshape(c.outputs[1].sizes);
  return {loss, l};
}

// grad_self by fp64 autograd; the scale of element j: |s| times the magnitudes of the formula's
// terms (class (1 - e) w_t (P_j + [j == t]) + (e / C) (W P_j + w_j), probabilities
// P_j Q + w_j q_j) times 1 + |x_j| + |lse| (the exp's argument, with the fp32 lse's rounding).
std::vector<Expected> backward_ref(const CeCase& k, const OpCall& c, std::map<std::string, at::Tensor>& in) {
  const CrossEntropyGeom g = cross_entropy_geometry(c).value();
  c10::AutoGradMode on(true);
  at::Tensor leaf = d64(in.at("self")).reshape({g.rows, g.classes}).detach().requires_grad_(true);
  at::Tensor loss = torch_loss(k, g, leaf, in, static_cast<int64_t>(g.reduction));
  at::Tensor grad = torch::autograd::grad({loss}, {leaf}, {d64(in.at("grad")).reshape(loss.sizes())})[0].detach();
  c10::NoGradGuard off;
  const at::Tensor x = leaf.detach();
  const double e = g.label_smoothing, C = static_cast<double>(g.classes);
  const at::Tensor lse = at::logsumexp(x, {1}, true), P = (x - lse).exp(), w = weight_row(g, in, x.options());
  const at::Tensor gr = d64(in.at("grad")).reshape({-1});
  at::Tensor s = (g.per_row() ? gr : gr.expand({g.rows})).reshape({g.rows, 1});
  const at::Tensor wt = row_weight(g, in, x.options());
  if (g.reduction == LossReduction::kMean) s = s / wt.sum().clamp_min(1e-300);
  at::Tensor mag;
  if (g.probs) {
    at::Tensor q = d64(in.at("target")).reshape({g.rows, g.classes}) * (1 - e) + e / C;
    mag = P * (w * q).sum(1, true) + w * q;
  } else {
    const at::Tensor t = in.at("target").reshape({g.rows, 1}).clamp(0, g.classes - 1);
    const at::Tensor keep = in.at("target").reshape({g.rows, 1}).ne(g.ignore_index).to(at::kDouble);
    const at::Tensor onehot = at::zeros_like(x).scatter_(1, t, 1.0);
    mag = (1 - e) * wt * (P + onehot) + (e / C) * (w.sum() * P + w) * keep;
  }
  Expected e0{grad, kUlps * s.abs() * mag * (1 + x.abs().nan_to_num(0, 0, 0) + lse.abs()) +
                        out_round(c.outputs[0].dtype) * grad.abs()};
  if (k.bad_target) {   // eager raises; the kernel poisons the row (mean: every row not ignored, through D)
    if (g.reduction == LossReduction::kMean)
      e0.ref.masked_fill_(in.at("target").reshape({g.rows, 1}).ne(g.ignore_index).expand({g.rows, g.classes}), NAN);
    else e0.ref[1].fill_(NAN);
  }
  e0.ref = e0.ref.reshape(c.outputs[0].sizes), e0.tol = e0.tol.reshape(c.outputs[0].sizes);
  return {e0};
}

// "" when `got` is within `e` (NaN where the reference is NaN, infinities equal).
std::string compare(const at::Tensor& got, const Expected& e) {
  const at::Tensor y = got.to(at::kDouble).reshape({-1}), r = e.ref.reshape({-1}), tol = e.tol.reshape({-1});
  const at::Tensor ok = at::where(r.isnan(), y.isnan(), at::where(r.isinf(), y.eq(r), (y - r).abs() <= tol + 1e-37));
  const at::Tensor bad = ok.logical_not().nonzero().reshape({-1});
  std::string msg;
  for (int64_t n = 0; n < std::min<int64_t>(bad.numel(), 4); ++n) {
    const int64_t i = bad[n].item<int64_t>();
    msg += " [" + std::to_string(i) + "] got " + std::to_string(y[i].item<double>()) + " want " +
           std::to_string(r[i].item<double>()) + " (tol " + std::to_string(tol[i].item<double>()) + ")";
  }
  if (bad.numel()) msg += " (" + std::to_string(bad.numel()) + " of " + std::to_string(y.numel()) + " wrong)";
  return msg;
}

// Compiled binaries by source; two compiler processes at a time.
std::map<std::string, Result<CompileOutput>> compile_all(const std::vector<std::string>& sources) {
  std::vector<Result<CompileOutput>> out(sources.size(), Status::error(Code::kCompileError, "not compiled"));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < sources.size();) out[i] = cpu_backend().compile(sources[i]);
  };
  std::thread helper(work);
  work();
  helper.join();
  std::map<std::string, Result<CompileOutput>> m;
  for (size_t i = 0; i < sources.size(); ++i) m.emplace(sources[i], std::move(out[i]));
  return m;
}

struct Job {
  std::string where;
  OpCall call;
  Candidate cand;
  ResolvedSpec spec;
  size_t case_index;
};

// Runs a job serially and over threads on copies of the inputs; checks both and their equality.
void run_job(const Job& j, const CompileOutput& bin, std::map<std::string, at::Tensor> in, const std::vector<Expected>& want) {
  auto l = cpu_backend().load(bin.binary, j.spec);
  ASSERT_TRUE(l.is_ok()) << j.where << ": " << l.status().to_string();
  std::vector<at::Tensor> results[2];
  for (int threaded = 0; threaded < 2; ++threaded) {
    std::vector<void*> ptrs;
    std::vector<at::Tensor> outs;
    for (const auto& t : j.call.binding().tensors) {
      if (!t.defined) {
        ptrs.push_back(nullptr);
      } else if (in.count(t.name)) {
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
    for (size_t o = 0; o < outs.size(); ++o) {
      const std::string bad = compare(outs[o], want[o]);
      EXPECT_TRUE(bad.empty()) << j.where << (threaded ? " threaded" : " serial") << " out" << o << ":" << bad;
    }
    results[threaded] = outs;
  }
  for (size_t o = 0; o < results[0].size(); ++o) {
    const at::Tensor &a = results[0][o], &b = results[1][o];
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << j.where << " out" << o << ": serial and threaded results differ";
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

// The default and one setting with every knob off its default, its value rotating over the cases
// so each value of each knob runs somewhere.
std::vector<Knobs> settings(const Template& t, const OpCall& c, size_t i) {
  Knobs alt;
  for (const auto& d : t.space(c)) alt[d.name] = d.values.size() == 1 ? d.values[0] : d.values[1 + i % (d.values.size() - 1)];
  return {Knobs{}, alt};
}

TEST(CpuCrossEntropy, MatchesTorchForEveryFlagAndReduction) {
  const std::vector<CeCase> cs = cases();
  std::vector<Job> jobs;
  std::vector<std::string> sources;
  std::map<std::string, std::set<int64_t>> covered;
  for (size_t i = 0; i < cs.size(); ++i)
    for (OpId op : {OpId::kCrossEntropy, OpId::kCrossEntropyBackward}) {
      auto cr = make_call(op, cs[i].sizes, cs[i].dt, BackendKind::kCpu, cs[i].args);
      ASSERT_TRUE(cr.is_ok()) << cs[i].label << ": " << cr.status().to_string();
      const Template* t = cpu_template(cr.value());
      ASSERT_NE(t, nullptr) << cs[i].label << " " << op_info(op).name;
      for (const Knobs& k : settings(*t, cr.value(), i)) {
        auto r = t->render(cr.value(), k);
        if (!r.is_ok()) {
          ASSERT_EQ(r.status().code(), Code::kUnsupported) << cs[i].label << ": " << r.status().to_string();
          continue;
        }
        const std::string where = cs[i].label + " " + r->id();
        auto spec = parse_launch_spec(r->launch);
        ASSERT_TRUE(spec.is_ok()) << where << ": " << spec.status().to_string();
        auto rs = resolve(spec.value(), cr.value().binding());
        ASSERT_TRUE(rs.is_ok()) << where << ": " << rs.status().to_string() << "\n" << r->launch.dump();
        const StaticReport rep = static_check(r->source, cr.value());
        EXPECT_TRUE(rep.ok() && rep.findings.empty()) << where << ": " << rep.to_json().dump(1);
        if (std::find(sources.begin(), sources.end(), r->source) == sources.end()) sources.push_back(r->source);
        for (const auto& [n, v] : r->knobs) covered[std::string(t->name()) + "." + n].insert(v);
        jobs.push_back({where, cr.value(), r.value(), rs.value(), i});
      }
    }
  const auto bins = compile_all(sources);
  for (const auto& [src, bin] : bins) {
    ASSERT_TRUE(bin.is_ok()) << bin.status().to_string() << "\n" << src;
    EXPECT_EQ(bin->log.find("warning"), std::string::npos) << bin->log << "\n" << src;
  }
  for (const Job& j : jobs) {
    const CeCase& k = cs[j.case_index];
    std::map<std::string, at::Tensor> in = make_inputs(k, j.call, 1000 + j.case_index);
    const std::vector<Expected> want =
        j.call.op == OpId::kCrossEntropy ? forward_ref(k, j.call, in) : backward_ref(k, j.call, in);
    run_job(j, bins.at(j.cand.source).value(), in, want);
  }
  std::printf("[ cross_entropy ] %zu cases, %zu runs, %zu sources;", cs.size(), jobs.size(), sources.size());
  for (const auto& [n, vs] : covered) {
    std::printf(" %s={", n.c_str());
    for (int64_t v : vs) std::printf("%s%lld", v == *vs.begin() ? "" : ",", static_cast<long long>(v));
    std::printf("}");
    EXPECT_GE(vs.size(), 2u) << n << " ran with one value";
  }
  std::printf("\n");
}

// Calls the templates leave to eager: f16 (no 16-bit float type on the host), CUDA calls, a
// transposed self, and a grad in another dtype than the loss's.
TEST(CpuCrossEntropy, ScopeAndKnobs) {
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
  for (OpId op : {OpId::kCrossEntropy, OpId::kCrossEntropyBackward}) {
    EXPECT_TRUE(claimed(call(op, DType::kF32, json::object())));
    EXPECT_FALSE(claimed(call(op, DType::kF16, json::object())));
    OpCall cuda = call(op, DType::kF32, json::object());
    cuda.backend = BackendKind::kCuda;
    EXPECT_FALSE(claimed(cuda));
    OpCall tr = call(op, DType::kF32, json::object());
    for (auto& t : tr.inputs)
      if (t.name == "self") t.strides = {1, 8};
    EXPECT_FALSE(claimed(tr));
  }
  OpCall g16 = call(OpId::kCrossEntropyBackward, DType::kF32, {{"reduction", 0}});
  g16.inputs[0].dtype = DType::kBF16;
  EXPECT_FALSE(claimed(g16));
  // Unknown knobs and values outside the space are kUnsupported; absent tensors never named.
  const OpCall c = call(OpId::kCrossEntropy, DType::kF32, json::object());
  const Template* t = cpu_template(c);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->render(c, {{"warp", 1}}).status().code(), Code::kUnsupported);
  EXPECT_EQ(t->render(c, {{"unroll", 3}}).status().code(), Code::kUnsupported);
  auto r = t->render(c, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->launch.dump().find("ptr:weight"), std::string::npos);
  EXPECT_EQ(r->launch["launches"].size(), 2u) << "mean: rows, then the fold";
}

}  // namespace
}  // namespace kc::evolve
