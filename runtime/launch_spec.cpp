// Launch specs: JSON <-> LaunchSpec, and binding a spec to one key's metadata (resolve).
#include "runtime/launch_spec.h"

#include <cctype>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <set>

#include "runtime/expr.h"

namespace kc {
namespace {

Status invalid(const std::string& msg) { return Status::error(Code::kInvalid, "launch spec: " + msg); }

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// An expression field: a JSON integer or a string that parses as an int expression.
Status expr_field(const nlohmann::json& v, const std::string& where, std::string& out) {
  if (v.is_number_integer()) {
    out = v.is_number_unsigned() ? std::to_string(v.get<uint64_t>()) : std::to_string(v.get<int64_t>());
  } else if (v.is_string()) {
    out = v.get<std::string>();
  } else {
    return invalid(where + " must be an integer or an expression string");
  }
  Status s = check_int_expr(out);
  if (!s.is_ok()) return invalid(where + ": " + s.message());
  return Status::ok();
}

Status dims_field(const nlohmann::json& l, const char* key, const std::string& where, std::string out[3]) {
  auto it = l.find(key);
  if (it == l.end()) return invalid(where + " has no \"" + key + "\"");
  if (!it->is_array() || it->empty() || it->size() > 3)
    return invalid(where + "." + key + " must be an array of 1 to 3 dimensions");
  for (size_t d = 0; d < 3; ++d) {
    if (d >= it->size()) {
      out[d] = "1";
      continue;
    }
    KC_RETURN_IF_ERROR(expr_field((*it)[d], where + "." + key + "[" + std::to_string(d) + "]", out[d]));
  }
  return Status::ok();
}

Status check_arg(const std::string& a, const std::string& where) {
  size_t colon = a.find(':');
  if (colon == std::string::npos || colon + 1 >= a.size())
    return invalid(where + " '" + a + "' must be \"kind:what\"");
  std::string kind = a.substr(0, colon), what = a.substr(colon + 1);
  if (kind == "ptr") {
    if (!is_identifier(what)) return invalid(where + " '" + a + "': ptr needs a tensor or scratch name");
    return Status::ok();
  }
  if (kind == "i32" || kind == "i64") {
    Status s = check_int_expr(what);
    if (!s.is_ok()) return invalid(where + ": " + s.message());
    return Status::ok();
  }
  if (kind == "f32" || kind == "f64") return Status::ok();  // a name or a literal; checked in resolve
  return invalid(where + " '" + a + "': unknown kind '" + kind + "' (ptr, i32, i64, f32, f64)");
}

// A canonical integer literal goes back out as a JSON number, so parse(to_json(s)) == s.
nlohmann::json expr_json(const std::string& e) {
  if (e.empty() || e.size() > 18) return e;
  size_t i = e[0] == '-' ? 1 : 0;
  if (i == e.size() || (e[i] == '0' && e.size() > i + 1) || (i == 1 && e == "-0")) return e;
  for (size_t k = i; k < e.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(e[k]))) return e;
  return std::stoll(e);
}

Result<double> parse_float_literal(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return invalid("empty float");
  const char* b = s.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(b, &end);
  if (end != b + s.size()) return invalid("'" + s + "' is neither a float scalar of the binding nor a float literal");
  // strtod reports ERANGE for underflow too; only overflow to infinity is an error.
  if (errno == ERANGE && std::isinf(v)) return invalid("float literal '" + s + "' out of range");
  return v;
}

}  // namespace

Result<LaunchSpec> parse_launch_spec(const nlohmann::json& j) {
  if (!j.is_object()) return invalid("must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "version" && it.key() != "launches" && it.key() != "scratch")
      return invalid("unknown key \"" + it.key() + "\"");
  LaunchSpec s;
  if (auto v = j.find("version"); v != j.end()) {
    if (!v->is_number_integer() || v->get<int64_t>() != 1)
      return invalid("unsupported version " + v->dump() + " (this runtime reads version 1)");
  }
  std::set<std::string> scratch_names;
  if (auto sc = j.find("scratch"); sc != j.end()) {
    if (!sc->is_array()) return invalid("\"scratch\" must be an array");
    for (size_t i = 0; i < sc->size(); ++i) {
      const auto& e = (*sc)[i];
      std::string where = "scratch[" + std::to_string(i) + "]";
      if (!e.is_object()) return invalid(where + " must be an object");
      for (auto it = e.begin(); it != e.end(); ++it)
        if (it.key() != "name" && it.key() != "bytes") return invalid(where + ": unknown key \"" + it.key() + "\"");
      LaunchSpec::Scratch b;
      auto n = e.find("name");
      if (n == e.end() || !n->is_string() || !is_identifier(n->get<std::string>()))
        return invalid(where + ".name must be an identifier");
      b.name = n->get<std::string>();
      if (!scratch_names.insert(b.name).second) return invalid("duplicate scratch buffer '" + b.name + "'");
      auto by = e.find("bytes");
      if (by == e.end()) return invalid(where + " has no \"bytes\"");
      KC_RETURN_IF_ERROR(expr_field(*by, where + ".bytes", b.bytes));
      s.scratch.push_back(std::move(b));
    }
  }
  auto ls = j.find("launches");
  if (ls == j.end() || !ls->is_array() || ls->empty()) return invalid("\"launches\" must be a non-empty array");
  for (size_t i = 0; i < ls->size(); ++i) {
    const auto& l = (*ls)[i];
    std::string where = "launches[" + std::to_string(i) + "]";
    if (!l.is_object()) return invalid(where + " must be an object");
    for (auto it = l.begin(); it != l.end(); ++it)
      if (it.key() != "entry" && it.key() != "grid" && it.key() != "block" && it.key() != "smem" && it.key() != "args")
        return invalid(where + ": unknown key \"" + it.key() + "\"");
    LaunchSpec::Launch out;
    auto e = l.find("entry");
    if (e == l.end() || !e->is_string() || !is_identifier(e->get<std::string>()))
      return invalid(where + ".entry must be a C identifier");
    out.entry = e->get<std::string>();
    KC_RETURN_IF_ERROR(dims_field(l, "grid", where, out.grid));
    KC_RETURN_IF_ERROR(dims_field(l, "block", where, out.block));
    out.smem = "0";
    if (auto sm = l.find("smem"); sm != l.end()) KC_RETURN_IF_ERROR(expr_field(*sm, where + ".smem", out.smem));
    auto a = l.find("args");
    if (a == l.end() || !a->is_array()) return invalid(where + ".args must be an array of \"kind:what\" strings");
    for (size_t k = 0; k < a->size(); ++k) {
      std::string aw = where + ".args[" + std::to_string(k) + "]";
      if (!(*a)[k].is_string()) return invalid(aw + " must be a string");
      std::string arg = (*a)[k].get<std::string>();
      KC_RETURN_IF_ERROR(check_arg(arg, aw));
      out.args.push_back(std::move(arg));
    }
    s.launches.push_back(std::move(out));
  }
  return s;
}

nlohmann::json to_json(const LaunchSpec& s) {
  nlohmann::json j;
  j["version"] = s.version;
  nlohmann::json ls = nlohmann::json::array();
  for (const auto& l : s.launches) {
    nlohmann::json o;
    o["entry"] = l.entry;
    o["grid"] = {expr_json(l.grid[0]), expr_json(l.grid[1]), expr_json(l.grid[2])};
    o["block"] = {expr_json(l.block[0]), expr_json(l.block[1]), expr_json(l.block[2])};
    o["smem"] = expr_json(l.smem);
    o["args"] = l.args;
    ls.push_back(std::move(o));
  }
  j["launches"] = std::move(ls);
  if (!s.scratch.empty()) {
    nlohmann::json sc = nlohmann::json::array();
    for (const auto& b : s.scratch) sc.push_back({{"name", b.name}, {"bytes", expr_json(b.bytes)}});
    j["scratch"] = std::move(sc);
  }
  return j;
}

namespace {

Status resolve_expr(const std::string& e, const Binding& b, const std::string& where, int64_t& out) {
  Result<int64_t> r = eval_int_expr(e, b);
  if (!r.is_ok()) return invalid(where + ": " + r.status().message());
  out = r.value();
  return Status::ok();
}

Status resolve_float(const std::string& what, const Binding& b, const std::string& where, double& out) {
  if (const ScalarArg* a = b.scalar(what)) {
    if (auto* d = std::get_if<double>(&a->value)) out = *d;
    else if (auto* i = std::get_if<int64_t>(&a->value)) out = static_cast<double>(*i);
    else return invalid(where + ": scalar '" + what + "' is not a float or int");
    return Status::ok();
  }
  Result<double> r = parse_float_literal(what);
  if (!r.is_ok()) return invalid(where + ": " + r.status().message());
  out = r.value();
  return Status::ok();
}

Status resolve_param(const std::string& arg, const Binding& b, const ResolvedSpec& rs,
                     const LaunchSpec& spec, const std::string& where, Param& p) {
  size_t colon = arg.find(':');
  if (colon == std::string::npos) return invalid(where + " '" + arg + "' must be \"kind:what\"");
  std::string kind = arg.substr(0, colon), what = arg.substr(colon + 1);
  if (kind == "ptr") {
    p.kind = Param::Kind::kPtr;
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      if (b.tensors[i].name != what) continue;
      if (!b.tensors[i].defined) return invalid(where + ": tensor '" + what + "' is undefined (absent optional)");
      p.slot = static_cast<int>(i);
      return Status::ok();
    }
    for (size_t j = 0; j < spec.scratch.size(); ++j) {
      if (spec.scratch[j].name != what) continue;
      p.slot = rs.num_tensor_slots + static_cast<int>(j);
      return Status::ok();
    }
    return invalid(where + ": no tensor or scratch buffer named '" + what + "'");
  }
  if (kind == "i32" || kind == "i64") {
    int64_t v = 0;
    KC_RETURN_IF_ERROR(resolve_expr(what, b, where, v));
    if (kind == "i64") {
      p.kind = Param::Kind::kI64;
      p.imm.i64 = v;
      return Status::ok();
    }
    if (v < INT32_MIN || v > INT32_MAX)
      return invalid(where + ": value " + std::to_string(v) + " does not fit in i32");
    p.kind = Param::Kind::kI32;
    p.imm.i32 = static_cast<int32_t>(v);
    return Status::ok();
  }
  if (kind == "f32" || kind == "f64") {
    double v = 0;
    KC_RETURN_IF_ERROR(resolve_float(what, b, where, v));
    if (kind == "f64") {
      p.kind = Param::Kind::kF64;
      p.imm.f64 = v;
      return Status::ok();
    }
    // Narrowing a finite double beyond float range is undefined behaviour; refuse it.
    if (std::isfinite(v) && std::fabs(v) > FLT_MAX)
      return invalid(where + ": value " + std::to_string(v) + " does not fit in f32");
    p.kind = Param::Kind::kF32;
    p.imm.f32 = static_cast<float>(v);
    return Status::ok();
  }
  return invalid(where + ": unknown kind '" + kind + "'");
}

}  // namespace

Result<ResolvedSpec> resolve(const LaunchSpec& spec, const Binding& b) {
  if (spec.launches.empty()) return invalid("no launches");
  ResolvedSpec rs;
  rs.num_tensor_slots = static_cast<int>(b.tensors.size());
  for (const auto& sc : spec.scratch) {
    if (b.tensor(sc.name)) return invalid("scratch buffer '" + sc.name + "' has the name of a tensor argument");
    int64_t bytes;
    KC_RETURN_IF_ERROR(resolve_expr(sc.bytes, b, "scratch '" + sc.name + "'.bytes", bytes));
    if (bytes < 0) return invalid("scratch '" + sc.name + "' has negative size " + std::to_string(bytes));
    rs.scratch_bytes.push_back(bytes);
  }
  for (size_t i = 0; i < spec.launches.size(); ++i) {
    const auto& l = spec.launches[i];
    std::string where = "launches[" + std::to_string(i) + "] (" + l.entry + ")";
    ResolvedLaunch r;
    r.entry = l.entry;
    for (int d = 0; d < 3; ++d) {
      KC_RETURN_IF_ERROR(resolve_expr(l.grid[d], b, where + ".grid[" + std::to_string(d) + "]", r.grid[d]));
      KC_RETURN_IF_ERROR(resolve_expr(l.block[d], b, where + ".block[" + std::to_string(d) + "]", r.block[d]));
      if (r.grid[d] <= 0 || r.block[d] <= 0)
        return invalid(where + ": grid and block dimensions must be positive (grid[" + std::to_string(d) +
                       "]=" + std::to_string(r.grid[d]) + ", block[" + std::to_string(d) +
                       "]=" + std::to_string(r.block[d]) + ")");
    }
    KC_RETURN_IF_ERROR(resolve_expr(l.smem, b, where + ".smem", r.smem));
    if (r.smem < 0) return invalid(where + ": negative smem " + std::to_string(r.smem));
    for (size_t k = 0; k < l.args.size(); ++k) {
      Param p{};
      KC_RETURN_IF_ERROR(resolve_param(l.args[k], b, rs, spec, where + ".args[" + std::to_string(k) + "]", p));
      r.params.push_back(p);
    }
    rs.launches.push_back(std::move(r));
  }
  return rs;
}

}  // namespace kc
