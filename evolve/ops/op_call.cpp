// Calls from keys, from shapes, and to/from JSON. What is particular to an op family (its call
// from a shape, its outputs) is in its home, evolve/ops/.
#include "evolve/ops/op_call.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "evolve/ops/family.h"
#include "kernel_cache/key.h"

namespace kc::evolve {
namespace {

// A whole string as a double ("inf", "-inf" and "nan" included), without exceptions.
bool parse_double(const std::string& s, double& out) {
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

bool parse_ints(std::string_view s, std::vector<int64_t>& out) {   // "[1,2,3]"
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return false;
  s = s.substr(1, s.size() - 2);
  out.clear();
  while (!s.empty()) {
    size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    int64_t v = 0;
    auto r = std::from_chars(item.data(), item.data() + item.size(), v);
    if (r.ec != std::errc() || r.ptr != item.data() + item.size()) return false;
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    s = s.substr(comma + 1);
  }
  return true;
}

Status bad_key(const std::string& why) { return Status::error(Code::kInvalid, "key: " + why); }

// "f32[64,256]s[256,1]a16"
Result<TensorMeta> parse_tensor(const std::string& name, std::string_view body) {
  size_t lb = body.find('[');
  size_t sb = body.find("]s[");
  size_t ab = body.rfind("]a");
  if (lb == std::string_view::npos || sb == std::string_view::npos || ab == std::string_view::npos || ab < sb)
    return bad_key("tensor " + name);
  auto dt = dtype_from_name(body.substr(0, lb));
  if (!dt) return bad_key("dtype of " + name);
  TensorMeta m;
  m.name = name;
  m.dtype = *dt;
  if (!parse_ints(body.substr(lb, sb + 1 - lb), m.sizes) || !parse_ints(body.substr(sb + 2, ab + 1 - sb - 2), m.strides) ||
      m.sizes.size() != m.strides.size())
    return bad_key("sizes/strides of " + name);
  std::string_view a = body.substr(ab + 2);
  auto r = std::from_chars(a.data(), a.data() + a.size(), m.align);
  if (r.ec != std::errc()) return bad_key("alignment of " + name);
  return m;
}

}  // namespace

const TensorMeta* OpCall::input(const std::string& name) const {
  for (const auto& t : inputs)
    if (t.name == name) return &t;
  return nullptr;
}

const ScalarArg* OpCall::scalar(const std::string& name) const {
  for (const auto& s : scalars)
    if (s.name == name) return &s;
  return nullptr;
}

int64_t OpCall::int_arg(const std::string& name, int64_t dflt) const {
  const ScalarArg* s = scalar(name);
  if (!s) return dflt;
  if (auto* i = std::get_if<int64_t>(&s->value)) return *i;
  if (auto* b = std::get_if<bool>(&s->value)) return *b;
  if (auto* d = std::get_if<double>(&s->value)) return static_cast<int64_t>(*d);
  return dflt;
}

double OpCall::double_arg(const std::string& name, double dflt) const {
  const ScalarArg* s = scalar(name);
  if (!s) return dflt;
  if (auto* d = std::get_if<double>(&s->value)) return *d;
  if (auto* i = std::get_if<int64_t>(&s->value)) return static_cast<double>(*i);
  return dflt;
}

std::string OpCall::string_arg(const std::string& name, const std::string& dflt) const {
  const ScalarArg* s = scalar(name);
  if (!s) return dflt;
  if (auto* v = std::get_if<std::string>(&s->value)) return *v;
  return dflt;
}

std::vector<int64_t> OpCall::list_arg(const std::string& name) const {
  const ScalarArg* s = scalar(name);
  if (!s) return {};
  if (auto* v = std::get_if<std::vector<int64_t>>(&s->value)) return *v;
  return {};
}

Binding OpCall::binding() const {
  Binding b;
  b.tensors = inputs;
  b.tensors.insert(b.tensors.end(), outputs.begin(), outputs.end());
  b.scalars = scalars;
  return b;
}

bool OpCall::dense() const {
  for (const auto* list : {&inputs, &outputs})
    for (const auto& t : *list)
      if (t.defined && (!t.contiguous() || t.align < 16)) return false;
  return true;
}

Result<std::vector<TensorMeta>> infer_outputs(OpId op, const std::vector<TensorMeta>& in,
                                              const std::vector<ScalarArg>& scalars, BackendKind backend) {
  if (in.empty() || !in[0].defined) return Status::error(Code::kInvalid, "call without a lead tensor");
  OpCall c;
  c.op = op;
  c.backend = backend;
  c.inputs = in;
  c.scalars = scalars;
  return family_schema(op_info(op).family).outputs(c);
}

Result<OpCall> call_from_key(const std::string& key) {
  OpCall c;
  c.key = key;
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    size_t bar = key.find('|', start);
    fields.push_back(key.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  if (fields.size() < 5 || fields[0] != "kc" + std::to_string(kKeyVersion)) return bad_key("not a kc1 key");
  c.target = fields[1];
  auto target = parse_target(c.target);
  if (!target) return bad_key(target.status().message());
  c.backend = target->kind;
  auto op = op_by_name(fields[2]);
  if (!op) return bad_key("unknown op " + fields[2]);
  c.op = *op;
  c.policy = fields[3];
  for (size_t k = 4; k < fields.size(); ++k) {
    const std::string& f = fields[k];
    size_t eq = f.find('=');
    if (eq == std::string::npos) return bad_key("argument " + f);
    std::string name = f.substr(0, eq);
    std::string_view v(f);
    v = v.substr(eq + 1);
    if (v == "none") {
      c.inputs.push_back(absent_meta(name));
    } else if (v.rfind("T:", 0) == 0) {
      auto t = parse_tensor(name, v.substr(2));
      if (!t) return t.status();
      c.inputs.push_back(std::move(t.value()));
    } else if (v.size() >= 2 && v[1] == ':') {
      std::string_view body = v.substr(2);
      ScalarArg s{name, int64_t{0}};
      switch (v[0]) {
        case 'i': {
          int64_t x = 0;
          auto r = std::from_chars(body.data(), body.data() + body.size(), x);
          if (r.ec != std::errc()) return bad_key("int " + name);
          s.value = x;
          break;
        }
        case 'd': {
          double x = 0;
          if (!parse_double(std::string(body), x)) return bad_key("double " + name);
          s.value = x;
          break;
        }
        case 'b': s.value = body == "1"; break;
        case 's': s.value = std::string(body); break;
        case 'L': {
          std::vector<int64_t> l;
          if (!parse_ints(body, l)) return bad_key("list " + name);
          s.value = l;
          break;
        }
        default: return bad_key("argument kind of " + name);
      }
      c.scalars.push_back(std::move(s));
    } else {
      return bad_key("argument " + f);
    }
  }
  auto outs = infer_outputs(c.op, c.inputs, c.scalars, c.backend);
  if (!outs) return outs.status();
  c.outputs = std::move(outs.value());
  return c;
}

Result<OpCall> make_call(OpId op, const std::vector<int64_t>& sizes, DType dt, BackendKind backend,
                         const nlohmann::json& args) {
  OpCall c;
  c.op = op;
  c.backend = backend;
  try {
    if (Status st = family_schema(op_info(op).family).make(op, sizes, dt, args, c); !st) return st;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kInvalid, std::string("call arguments: ") + e.what());
  }
  auto outs = infer_outputs(op, c.inputs, c.scalars, backend);
  if (!outs) return outs.status();
  c.outputs = std::move(outs.value());
  return c;
}

std::string call_key(const OpCall& c) {
  KeyBuilder kb(c.target, op_info(c.op).aten, c.policy.c_str());
  for (const auto& t : c.inputs) kb.tensor(t.name.c_str(), t);
  for (const auto& s : c.scalars) {
    const char* n = s.name.c_str();
    std::visit([&](const auto& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (std::is_same_v<V, int64_t>) kb.i(n, v);
      else if constexpr (std::is_same_v<V, double>) kb.d(n, v);
      else if constexpr (std::is_same_v<V, bool>) kb.b(n, v);
      else if constexpr (std::is_same_v<V, std::string>) kb.s(n, v);
      else kb.list(n, v.data(), v.size());
    }, s.value);
  }
  return kb.take();
}

namespace {
nlohmann::json meta_json(const TensorMeta& t) {
  if (!t.defined) return {{"name", t.name}, {"defined", false}};
  return {{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"sizes", t.sizes}, {"strides", t.strides}, {"align", t.align}};
}
Result<TensorMeta> meta_from(const nlohmann::json& j) {
  TensorMeta t;
  t.name = j.at("name").get<std::string>();
  if (!j.value("defined", true)) return absent_meta(t.name);
  auto dt = dtype_from_name(j.at("dtype").get<std::string>());
  if (!dt) return Status::error(Code::kInvalid, "dtype of " + t.name);
  t.dtype = *dt;
  t.sizes = j.at("sizes").get<std::vector<int64_t>>();
  t.strides = j.at("strides").get<std::vector<int64_t>>();
  t.align = j.at("align").get<int>();
  if (t.sizes.size() != t.strides.size()) return Status::error(Code::kInvalid, "rank of " + t.name);
  return t;
}
}  // namespace

nlohmann::json to_json(const OpCall& c) {
  nlohmann::json j = {{"op", op_info(c.op).name}, {"backend", backend_name(c.backend)}, {"key", c.key},
                      {"target", c.target}, {"policy", c.policy}};
  j["inputs"] = nlohmann::json::array();
  for (const auto& t : c.inputs) j["inputs"].push_back(meta_json(t));
  j["outputs"] = nlohmann::json::array();
  for (const auto& t : c.outputs) j["outputs"].push_back(meta_json(t));
  j["scalars"] = nlohmann::json::array();
  for (const auto& s : c.scalars) {
    nlohmann::json v;
    std::string kind;
    std::visit([&](const auto& x) {
      using V = std::decay_t<decltype(x)>;
      v = x;
      // JSON has no infinity (a norm's order may be one): non-finite doubles travel as text.
      if constexpr (std::is_same_v<V, double>)
        if (!std::isfinite(x)) v = std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
      kind = std::is_same_v<V, int64_t> ? "i" : std::is_same_v<V, double> ? "d" : std::is_same_v<V, bool> ? "b"
           : std::is_same_v<V, std::string> ? "s" : "L";
    }, s.value);
    j["scalars"].push_back({{"name", s.name}, {"kind", kind}, {"value", v}});
  }
  return j;
}

Result<OpCall> call_from_json(const nlohmann::json& j) {
  try {
    OpCall c;
    auto op = op_by_name(j.at("op").get<std::string>());
    if (!op) return Status::error(Code::kInvalid, "unknown op");
    c.op = *op;
    auto backend = backend_from_name(j.at("backend").get<std::string>());
    if (!backend) return Status::error(Code::kInvalid, "call json: unknown backend");
    c.backend = *backend;
    c.key = j.value("key", "");
    c.target = j.value("target", "");
    c.policy = j.value("policy", "fp32");
    for (const auto& t : j.at("inputs")) {
      auto m = meta_from(t);
      if (!m) return m.status();
      c.inputs.push_back(m.value());
    }
    for (const auto& t : j.at("outputs")) {
      auto m = meta_from(t);
      if (!m) return m.status();
      c.outputs.push_back(m.value());
    }
    for (const auto& s : j.at("scalars")) {
      std::string kind = s.at("kind").get<std::string>();
      ScalarArg a{s.at("name").get<std::string>(), int64_t{0}};
      const auto& v = s.at("value");
      if (kind == "i") a.value = v.get<int64_t>();
      else if (kind == "d" && v.is_string()) {
        double x = 0;
        if (!parse_double(v.get<std::string>(), x)) return Status::error(Code::kInvalid, "call json: double " + a.name);
        a.value = x;
      } else if (kind == "d") a.value = v.get<double>();
      else if (kind == "b") a.value = v.get<bool>();
      else if (kind == "s") a.value = v.get<std::string>();
      else a.value = v.get<std::vector<int64_t>>();
      c.scalars.push_back(std::move(a));
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kInvalid, std::string("call json: ") + e.what());
  }
}

}  // namespace kc::evolve
