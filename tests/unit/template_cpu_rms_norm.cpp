// The RMSNorm CPU templates (cpu.rms_norm, cpu.rms_norm_backward) end to end against torch: f32
// and bf16, weight on and off, every output_mask, one row, odd and long rows, a multi-dim
// normalized_shape, many rows (the grad_weight slabs and the fused pass). Per case the default
// knobs and every other value of every knob, one at a time, are rendered, resolved, statically
// checked, host-compiled and run serially and over threads (bit-identical). References are
// at::rms_norm and its autograd in fp64 on the same (rounded) inputs, rstd in fp64; each element
// may be off by k ulp of fp32 times the conditioning of its formula, plus one rounding of a bf16
// output (the CE test's budget). Candidates run on torch tensors (the harness of
// template_cpu_harness.h holds fp32 buffers only).
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
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "evolve/ops/eager.h"
#include "evolve/ops/rms_norm.h"
#include "evolve/propose/proposer.h"
#include "evolve/verify/static_check.h"
#include "runtime/cpu_backend.h"
#include "runtime/launch_spec.h"

namespace kc::evolve {
namespace {

using nlohmann::json;

struct RmsCase {
  std::string label;
  std::vector<int64_t> sizes;
  DType dt;
  json args;   // normalized_shape, weight, eps (forward); output_mask added per backward variant
};

std::vector<RmsCase> cases() {
  std::vector<RmsCase> v;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string d = dt == DType::kF32 ? "f32" : "bf16";
    for (bool w : {true, false}) {
      const std::string ws = w ? "-w" : "";
      v.push_back({d + "-rows" + ws, {37, 64}, dt, {{"weight", w}}});
      v.push_back({d + "-multidim" + ws, {3, 5, 6, 7}, dt, {{"normalized_shape", {6, 7}}, {"weight", w}, {"eps", 1e-5}}});
    }
    v.push_back({d + "-one-row-w", {1000}, dt, {{"weight", true}}});
    v.push_back({d + "-odd-w", {13, 33}, dt, {{"weight", true}, {"eps", 0.1}}});
    v.push_back({d + "-many-rows-w", {1100, 24}, dt, {{"weight", true}}});
  }
  v.push_back({"f32-long-rows-w", {3, 40000}, DType::kF32, {{"weight", true}}});
  return v;
}

// The backward variants of a case's output_mask: both, grad_input only, grad_weight only.
std::vector<json> masks(const RmsCase& k) {
  if (!k.args.value("weight", true)) return {json::array({1, 0})};
  return {json::array({1, 1}), json::array({1, 0}), json::array({0, 1})};
}

// A parallel_for over 3 std::threads with uneven parts, as at::parallel_for may split a range.
void threaded_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t cut1 = n / 5, cut2 = n / 5 + (n - n / 5) / 2;
  std::vector<std::thread> ts;
  for (auto [b, e] : {std::pair{int64_t{0}, cut1}, std::pair{cut1, cut2}, std::pair{cut2, n}})
    if (b < e) ts.emplace_back(fn, b, e);
  for (auto& t : ts) t.join();
}

at::Tensor d64(const at::Tensor& t) { return t.defined() ? t.to(at::kDouble) : t; }

// The inputs by name: rows around zero at different scales (one ten times larger, one all zero),
// a weight around one, the output's gradient and the forward's fp32 rstd (backward).
std::map<std::string, at::Tensor> make_inputs(const OpCall& c, uint64_t seed) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  at::manual_seed(seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor x = at::randn({g.rows, g.cols}, f64) * (at::rand({g.rows, 1}, f64) * 3 + 0.1);
  if (g.rows > 1) x[1] *= 10;
  if (g.rows > 2) x[2].zero_();
  std::map<std::string, at::Tensor> in;
  for (const auto& t : c.inputs) {
    if (!t.defined) continue;
    const at::ScalarType st = to_scalar_type(t.dtype);
    if (t.name == "input") in[t.name] = x.reshape(t.sizes).to(st);
    else if (t.name == "weight") in[t.name] = (at::randn(t.sizes, f64) * 0.5 + 1).to(st);
    else if (t.name == "grad") in[t.name] = at::randn(t.sizes, f64).to(st);
  }
  if (g.backward) {
    const at::Tensor xr = d64(in.at("input")).reshape({g.rows, g.cols});
    in["rstd"] = (xr.square().mean({1}, true) + g.eps).rsqrt().to(at::kFloat).reshape(g.stat_sizes);
  }
  return in;
}

struct Expected {
  at::Tensor ref, tol;   // fp64, the outputs' sizes
};

constexpr double kUlps = 32 * FLT_EPSILON;

// An absent weight as rms_norm takes it (an undefined tensor is not "no weight" there).
std::optional<at::Tensor> opt(const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; }

// One rounding of a bf16 result (half its ulp), relative to the value.
double out_round(DType d) { return d == DType::kBF16 ? std::ldexp(1.0, -8) : 0.0; }

// out = x rstd w, rstd: each a few roundings of its own size.
std::vector<Expected> forward_ref(const OpCall& c, std::map<std::string, at::Tensor>& in) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  const at::Tensor x = d64(in.at("input")), w = in.count("weight") ? d64(in.at("weight")) : at::Tensor();
  const at::Tensor out = at::rms_norm(x, c.list_arg("normalized_shape"), opt(w), g.eps);
  const at::Tensor rstd = (x.reshape({g.rows, g.cols}).square().mean({1}, true) + g.eps).rsqrt().reshape(g.stat_sizes);
  return {{out, (kUlps + out_round(g.dt)) * out.abs()}, {rstd, kUlps * rstd}};
}

// Autograd in fp64 through at::rms_norm; grad_input's scale rstd (|a| + |xhat| mean |a xhat|),
// grad_weight's sum over rows of |grad xhat|.
std::vector<Expected> backward_ref(const OpCall& c, std::map<std::string, at::Tensor>& in) {
  const RmsNormGeom g = rms_norm_geometry(c).value();
  c10::AutoGradMode on(true);
  at::Tensor x = d64(in.at("input")).detach().requires_grad_(true);
  at::Tensor w = in.count("weight") ? d64(in.at("weight")).detach().requires_grad_(true) : at::Tensor();
  at::Tensor out = at::rms_norm(x, c.list_arg("normalized_shape"), opt(w), g.eps);
  std::vector<at::Tensor> leaves = {x};
  if (w.defined()) leaves.push_back(w);
  const auto grads = torch::autograd::grad({out}, leaves, {d64(in.at("grad"))});
  c10::NoGradGuard off;
  const at::Tensor gr = d64(in.at("grad")).reshape({g.rows, g.cols});
  const at::Tensor r = d64(in.at("rstd")).reshape({g.rows, 1});
  const at::Tensor xh = x.detach().reshape({g.rows, g.cols}) * r;
  const at::Tensor a = w.defined() ? gr * w.detach().reshape({1, -1}) : gr;
  std::vector<Expected> e;
  if (g.want_input) {
    const at::Tensor gi = grads[0];
    const at::Tensor scale = r * (a.abs() + xh.abs() * (a * xh).abs().mean(1, true));
    e.push_back({gi, kUlps * scale.reshape(gi.sizes()) + out_round(g.dt) * gi.abs()});
  }
  if (g.want_weight) {
    const at::Tensor gw = grads.back();
    e.push_back({gw, kUlps * (gr * xh).abs().sum(0).reshape(gw.sizes()) + out_round(g.dt) * gw.abs()});
  }
  return e;
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

// The default, then each other value of each knob alone; fuse=1 takes the largest slab size with
// it, and where fusing is the default, unfused whole-row settings turn it off.
std::vector<Knobs> settings(const Template& t, const OpCall& c) {
  const std::vector<KnobDim> sp = t.space(c);
  auto dim = [&](const char* n) { return std::find_if(sp.begin(), sp.end(), [&](const KnobDim& d) { return d.name == n; }); };
  const bool fused = dim("fuse") != sp.end() && dim("fuse")->values.front() == 1;
  std::vector<Knobs> v = {Knobs{}};
  for (const auto& d : sp)
    for (size_t i = 1; i < d.values.size(); ++i) {
      const int64_t x = d.values[i];
      Knobs k = {{d.name, x}};
      if (d.name == "fuse" && x == 1) k["wb_rows"] = dim("wb_rows")->values.back();
      if (fused && (d.name == "rows" || d.name == "split" || (d.name == "wb_rows" && x == 0))) k["fuse"] = 0;
      v.push_back(k);
    }
  return v;
}

TEST(CpuRmsNorm, MatchesTorchForEveryKnobAndFlag) {
  const std::vector<RmsCase> cs = cases();
  std::vector<Job> jobs;
  std::vector<std::string> sources;
  std::map<std::string, std::set<int64_t>> covered, offered;
  auto add = [&](const std::string& label, OpId op, const std::vector<int64_t>& sizes, DType dt, const json& args, uint64_t seed) {
    auto cr = make_call(op, sizes, dt, BackendKind::kCpu, args);
    ASSERT_TRUE(cr.is_ok()) << label << ": " << cr.status().to_string();
    const Template* t = cpu_template(cr.value());
    ASSERT_NE(t, nullptr) << label;
    for (const auto& d : t->space(cr.value())) offered[std::string(t->name()) + "." + d.name].insert(d.values.begin(), d.values.end());
    for (const Knobs& k : settings(*t, cr.value())) {
      auto r = t->render(cr.value(), k);
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
    add(cs[i].label, OpId::kRmsNorm, cs[i].sizes, cs[i].dt, cs[i].args, 100 + i);
    for (const json& m : masks(cs[i])) {
      json a = cs[i].args;
      a["output_mask"] = m;
      add(cs[i].label + "/mask" + m.dump(), OpId::kRmsNormBackward, cs[i].sizes, cs[i].dt, a, 100 + i);
    }
  }
  const auto bins = compile_all(sources);
  for (const auto& [src, bin] : bins) {
    ASSERT_TRUE(bin.is_ok()) << bin.status().to_string() << "\n" << src;
    EXPECT_EQ(bin->log.find("warning"), std::string::npos) << bin->log << "\n" << src;
  }
  for (const Job& j : jobs) {
    std::map<std::string, at::Tensor> in = make_inputs(j.call, j.seed);
    const std::vector<Expected> want = j.call.op == OpId::kRmsNorm ? forward_ref(j.call, in) : backward_ref(j.call, in);
    run_job(j, bins.at(j.cand.source).value(), in, want);
  }
  std::printf("[ rms_norm ] %zu cases, %zu runs, %zu sources;", cs.size(), jobs.size(), sources.size());
  for (const auto& [n, vs] : offered) {
    std::printf(" %s={", n.c_str());
    for (int64_t v : covered[n]) std::printf("%s%lld", v == *covered[n].begin() ? "" : ",", static_cast<long long>(v));
    std::printf("}");
    EXPECT_EQ(covered[n], vs) << n << ": some values never ran";
  }
  std::printf("\n");
}

// Calls the templates leave to eager: f16 (no 16-bit float type on the host), CUDA calls, a
// transposed input; and knob misuse.
TEST(CpuRmsNorm, ScopeAndKnobs) {
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
  for (OpId op : {OpId::kRmsNorm, OpId::kRmsNormBackward}) {
    EXPECT_TRUE(claimed(call(op, DType::kF32, json::object())));
    EXPECT_TRUE(claimed(call(op, DType::kBF16, json::object())));
    EXPECT_FALSE(claimed(call(op, DType::kF16, json::object())));
    OpCall cuda = call(op, DType::kF32, json::object());
    cuda.backend = BackendKind::kCuda;
    EXPECT_FALSE(claimed(cuda));
    OpCall tr = call(op, DType::kF32, json::object());
    for (auto& t : tr.inputs)
      if (t.name == "input") t.strides = {1, 8};
    EXPECT_FALSE(claimed(tr));
  }
  const OpCall f = call(OpId::kRmsNorm, DType::kF32, {{"weight", false}});
  const Template* t = cpu_template(f);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->render(f, {{"warp", 1}}).status().code(), Code::kUnsupported);
  EXPECT_EQ(t->render(f, {{"unroll", 3}}).status().code(), Code::kUnsupported);
  auto r = t->render(f, {});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->knobs.size(), t->space(f).size());
  EXPECT_EQ(r->launch.dump().find("ptr:weight"), std::string::npos);
  // Masked-out grads are neither named nor written; the fused pass needs whole rows and slabs.
  const OpCall bx = call(OpId::kRmsNormBackward, DType::kF32, {{"output_mask", {1, 0}}});
  auto rx = cpu_template(bx)->render(bx, {});
  ASSERT_TRUE(rx.is_ok());
  EXPECT_EQ(rx->launch.dump().find("ptr:out1"), std::string::npos);
  const OpCall bw = call(OpId::kRmsNormBackward, DType::kF32, {{"output_mask", {0, 1}}});
  auto rw = cpu_template(bw)->render(bw, {});
  ASSERT_TRUE(rw.is_ok());
  EXPECT_EQ(rw->launch.dump().find("ptr:out0"), std::string::npos);
  const OpCall both = call(OpId::kRmsNormBackward, DType::kF32, json::object());
  const Template* bt = cpu_template(both);
  EXPECT_EQ(bt->render(both, {{"fuse", 1}, {"wb_rows", 0}}).status().code(), Code::kUnsupported);
  // Work splits are in the spec only: one source serves them.
  auto a = bt->render(both, {}), b = bt->render(both, {{"rows", 1}, {"wb_cols", 64}});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->source, b->source);
}

}  // namespace
}  // namespace kc::evolve
