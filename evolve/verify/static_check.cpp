// The static source check: the rules of static_check_rules.cpp (id, backend, where it looks,
// pattern, severity, when it applies, why) run over views of the source that have comments and
// string literals blanked, so neither can trigger or hide a finding. Three rules need more than a regex (mutable state that
// survives launches, the include allowlist, 32-bit index math); they are rows of the same table.
#include "evolve/verify/static_check.h"
#include "evolve/verify/static_check_rules.h"

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>
#include <span>

namespace kc::evolve {
namespace {

using namespace rules;   // the table and its types (static_check_rules.h)

struct Ctx {
  bool cuda = true;
  std::string policy;
  bool float_data = true, has_f16 = false, has_bf16 = false;
  int64_t max_numel = 0;
};

bool applies(When w, const Ctx& c) {
  switch (w) {
    case When::kAlways: return true;
    case When::kFloatData: return c.float_data;
    case When::kNoFp16: return c.float_data && !c.has_f16;
    case When::kNoBf16: return c.float_data && !c.has_bf16 && c.policy != "bf16";
    case When::kNoTensorCore: return c.float_data && !c.has_f16 && !c.has_bf16 && c.policy == "fp32";
  }
  return true;
}

bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The source after line splicing with views of equal length; line[i] is the original line of text[i].
struct Views {
  // quoted: what the string rules read (asm operands, attributes, pragmas, preprocessor lines
  // other than #include); includes: the #include lines alone, for the include allowlist, so that
  // naming a header (<mma.h>) is never read as using what it declares.
  std::string text, nocomment, code, quoted, decl, includes;
  std::vector<int> line;
  std::vector<std::string> original;   // original lines, for Finding::text
};

void blank(std::string& s, size_t from, size_t to) {
  for (size_t i = from; i < to && i < s.size(); ++i)
    if (s[i] != '\n') s[i] = ' ';
}

// Index of the ')' matching the '(' at `open` in `s` (strings are already blanked), or npos.
size_t match_paren(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    else if (s[i] == ')' && --depth == 0) return i;
  }
  return std::string::npos;
}

// The source as lines (original), and as one text with backslash-newlines spliced (phase 2 of
// translation) with the original line of each character.
void split_and_splice(const std::string& src, Views& v) {
  int ln = 1;
  size_t start = 0;
  for (size_t i = 0; i <= src.size(); ++i)
    if (i == src.size() || src[i] == '\n') {
      std::string l = src.substr(start, i - start);
      if (!l.empty() && l.back() == '\r') l.pop_back();
      v.original.push_back(l);
      start = i + 1;
    }
  for (size_t i = 0; i < src.size(); ++i) {   // phase 2: backslash-newline splices lines
    if (src[i] == '\\' && (i + 1 < src.size() && (src[i + 1] == '\n' || (src[i + 1] == '\r' && i + 2 < src.size() && src[i + 2] == '\n')))) {
      i += src[i + 1] == '\r' ? 2 : 1;
      ++ln;
      continue;
    }
    v.text.push_back(src[i]);
    v.line.push_back(ln);
    if (src[i] == '\n') ++ln;
  }
  v.line.push_back(ln);
}

// nocomment: comments blanked; code: string and character literals blanked as well.
void blank_comments_and_literals(Views& v) {
  const std::string& t = v.text;
  const size_t n = t.size();
  v.nocomment = t;
  v.code = t;
  for (size_t i = 0; i < n;) {
    if (t[i] == '/' && i + 1 < n && t[i + 1] == '/') {
      size_t e = t.find('\n', i);
      if (e == std::string::npos) e = n;
      blank(v.nocomment, i, e), blank(v.code, i, e);
      i = e;
    } else if (t[i] == '/' && i + 1 < n && t[i + 1] == '*') {
      size_t e = t.find("*/", i + 2);
      e = e == std::string::npos ? n : e + 2;
      blank(v.nocomment, i, e), blank(v.code, i, e);
      i = e;
    } else if (t[i] == '"' || t[i] == '\'') {
      // A quote after a number's digits is a C++14 digit separator (1'000), not a literal.
      size_t b = i;
      while (b > 0 && (is_ident(t[b - 1]) || t[b - 1] == '.')) --b;
      if (t[i] == '\'' && b < i && std::isdigit(static_cast<unsigned char>(t[b]))) { ++i; continue; }
      std::string prefix = t.substr(b, i - b);
      size_t e;
      if (t[i] == '"' && !prefix.empty() && prefix.back() == 'R') {   // raw string R"d( ... )d"
        size_t lp = t.find('(', i);
        std::string close = ")" + (lp == std::string::npos ? std::string() : t.substr(i + 1, lp - i - 1)) + "\"";
        e = lp == std::string::npos ? std::string::npos : t.find(close, lp);
        e = e == std::string::npos ? n : e + close.size() - 1;
      } else {
        e = i + 1;
        while (e < n && t[e] != t[i] && t[e] != '\n') e += t[e] == '\\' ? 2 : 1;
        e = std::min(e, n);
      }
      blank(v.code, i + 1, e);   // keep the delimiters so `extern "C"` still reads as extern "..."
      i = e + 1;
    } else {
      ++i;
    }
  }
}

// quoted keeps preprocessor lines (includes apart, in `includes`); decl drops them.
void preprocessor_views(Views& v) {
  const std::string& t = v.text;
  const size_t n = t.size();
  v.quoted.assign(n, ' ');
  v.decl = v.code;
  for (size_t i = 0; i < n; ++i)
    if (t[i] == '\n') v.quoted[i] = '\n';
  v.includes = v.quoted;
  static const std::regex kIncludeLine(R"(^\s*#\s*include\b)");
  for (size_t ls = 0; ls < n;) {   // preprocessor lines: quoted (or includes) keeps them, decl drops them
    size_t le = t.find('\n', ls);
    if (le == std::string::npos) le = n;
    size_t f = v.code.find_first_not_of(" \t", ls);
    if (f < le && v.code[f] == '#') {
      const bool include = std::regex_search(v.code.substr(ls, le - ls), kIncludeLine);
      std::string& dest = include ? v.includes : v.quoted;
      std::copy(v.nocomment.begin() + ls, v.nocomment.begin() + le, dest.begin() + ls);
      blank(v.decl, ls, le);
    }
    ls = le + 1;
  }
}

// What asm, attributes and _Pragma carry in their parentheses reads as quoted text too.
void carrier_views(Views& v) {
  const size_t n = v.text.size();
  static const std::regex kCarrier(R"(\b(asm|__asm__|__asm|__attribute__|_Pragma)\b(\s|volatile|__volatile__|goto|inline)*\()");
  for (auto it = std::sregex_iterator(v.code.begin(), v.code.end(), kCarrier); it != std::sregex_iterator(); ++it) {
    size_t open = it->position() + it->length() - 1;
    size_t close = match_paren(v.code, open);
    if (close == std::string::npos) close = n - 1;
    std::copy(v.nocomment.begin() + open, v.nocomment.begin() + close + 1, v.quoted.begin() + open);
  }
}

Views make_views(const std::string& src) {
  Views v;
  split_and_splice(src, v);
  blank_comments_and_literals(v);
  preprocessor_views(v);
  carrier_views(v);
  return v;
}

std::string trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Position of the last whole-word occurrence of `w` in `s`, or npos.
size_t last_word(const std::string& s, const std::string& w) {
  for (size_t p = s.rfind(w); p != std::string::npos; p = p ? s.rfind(w, p - 1) : std::string::npos)
    if ((p == 0 || !is_ident(s[p - 1])) && (p + w.size() >= s.size() || !is_ident(s[p + w.size()]))) return p;
  return std::string::npos;
}
bool has_word(const std::string& s, const std::string& w) { return last_word(s, w) != std::string::npos; }

// Immutable if constexpr, or const applies to the variable itself (not only to what it points at).
bool immutable(const std::string& head) {
  if (has_word(head, "constexpr") || has_word(head, "__constant__")) return true;
  const size_t star = head.find_last_of("*&"), c = last_word(head, "const");
  return c != std::string::npos && (star == std::string::npos || c > star);
}

// `template <...> rest` -> `rest`.
std::string strip_template(std::string s) {
  s = trim(s);
  if (s.rfind("template", 0) == 0) {
    int depth = 0;
    for (size_t i = 8; i < s.size(); ++i) {
      if (s[i] == '<') ++depth;
      else if (s[i] == '>' && --depth == 0) return trim(s.substr(i + 1));
    }
  }
  return s;
}

// Removes attribute-like groups with parentheses (alignas(16), __align__(8), __attribute__((...)),
// [[...]]) and a leading template<...> so that a remaining '(' means a function.
std::string declarator_head(std::string s) {
  static const std::regex kAttr(R"(\b(alignas|__align__|__attribute__|__declspec|__launch_bounds__)\s*\()");
  std::smatch m;
  while (std::regex_search(s, m, kAttr)) {
    size_t open = m.position() + m.length() - 1, close = match_paren(s, open);
    s.erase(m.position(), (close == std::string::npos ? s.size() : close + 1) - m.position());
  }
  for (size_t a; (a = s.find("[[")) != std::string::npos;) {
    size_t e = s.find("]]", a);
    s.erase(a, e == std::string::npos ? std::string::npos : e + 2 - a);
  }
  s = strip_template(s);
  int depth = 0;   // cut at the initializer or array bound
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(' || s[i] == '<') ++depth;
    else if (s[i] == ')' || s[i] == '>') --depth;
    else if (depth <= 0 && (s[i] == '[' || s[i] == '{' || (s[i] == '=' && (i + 1 >= s.size() || s[i + 1] != '='))))
      return trim(s.substr(0, i));
  }
  return s;
}

// True when `t` has an '=' at parenthesis depth 0 that is an assignment, not a comparison.
bool assigns(const std::string& t) {
  int depth = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '(' || t[i] == '[') ++depth;
    else if (t[i] == ')' || t[i] == ']') --depth;
    else if (t[i] == '=' && depth == 0 && (i + 1 >= t.size() || t[i + 1] != '=') &&
             (i == 0 || std::string("=<>!").find(t[i - 1]) == std::string::npos))
      return true;
  }
  return false;
}

const std::set<std::string> kNotADeclaration = {
    "typedef", "using",  "struct", "class", "union", "enum",   "namespace", "friend", "return",
    "static_assert", "goto", "break", "continue", "case", "default", "else", "do", "if", "for",
    "while", "switch", "try", "public", "private", "protected", "extern", "operator", "template"};

// Emits a finding when `stmt` (one statement, no trailing ';' or '{') declares mutable state that
// outlives a launch.
void check_declaration(const std::string& stmt, bool ns_scope, const Ctx& c, std::vector<size_t>& hits, size_t pos) {
  std::string head = declarator_head(stmt);
  if (head.empty() || head.find('(') != std::string::npos) return;   // functions, calls, casts
  std::smatch first;
  static const std::regex kFirstWord(R"(^\s*([A-Za-z_]\w*))");
  if (!std::regex_search(head, first, kFirstWord) || kNotADeclaration.count(first[1])) return;
  static const std::regex kTwoNames(R"([A-Za-z_]\w*[\s\*&:<>,]+[A-Za-z_]\w*)");
  if (!std::regex_search(head, kTwoNames)) return;   // `x`, `i++`: not a declaration
  if (has_word(head, "__shared__") || immutable(head)) return;
  const bool is_static = has_word(head, "static") || has_word(head, "thread_local");
  bool state;
  if (c.cuda) state = ns_scope ? (has_word(head, "__device__") || has_word(head, "__managed__")) : is_static;
  else state = ns_scope || is_static;
  if (state) hits.push_back(pos);
}

// Statement scan over `decl`: tracks braces (namespace-like or not) and checks every statement that
// could declare a variable with static storage.
std::vector<size_t> device_state(const Views& v, const Ctx& c) {
  std::vector<size_t> hits;
  const std::string& s = v.decl;
  std::vector<bool> braces;   // true: namespace or extern "C" block
  size_t stmt = 0;
  int paren = 0;
  auto at_ns = [&] { return std::all_of(braces.begin(), braces.end(), [](bool b) { return b; }); };
  auto start_of = [&](size_t from) { size_t f = s.find_first_not_of(" \t\r\n", from); return f == std::string::npos ? from : f; };
  static const std::regex kNamespace(R"(^\s*(inline\s+)?namespace\b|^\s*extern\s*"\s*"\s*$)");
  static const std::regex kBlockWord(R"(^\s*(else|do|try|struct|class|union|enum|namespace|case|default|public|private|protected|template|extern)\b)");
  for (size_t i = 0; i < s.size(); ++i) {
    char ch = s[i];
    if (ch == '(' || ch == '[') ++paren;
    else if (ch == ')' || ch == ']') paren = std::max(0, paren - 1);
    else if (paren > 0) continue;
    else if (ch == ';') {
      const std::string text = s.substr(stmt, i - stmt);
      if (at_ns() || has_word(text, "static") || has_word(text, "thread_local"))
        check_declaration(text, at_ns(), c, hits, start_of(stmt));
      stmt = i + 1;
    } else if (ch == '{') {
      const std::string t = trim(s.substr(stmt, i - stmt)), u = strip_template(t);
      const bool braced_init = !u.empty() && !std::regex_search(u, kBlockWord) && u.find('(') == std::string::npos &&
                               (is_ident(u.back()) || u.back() == ']');
      const bool initializer = !u.empty() && u.find("operator") == std::string::npos && (assigns(u) || braced_init);
      if (initializer) {   // `T x = {...}` / `T x{...}`: skip the braces, the statement goes on to ';'
        int depth = 0;
        for (; i < s.size(); ++i) {
          if (s[i] == '{') ++depth;
          else if (s[i] == '}' && --depth == 0) break;
        }
        continue;
      }
      braces.push_back(std::regex_search(t, kNamespace));
      stmt = i + 1;
    } else if (ch == '}') {
      if (!braces.empty()) braces.pop_back();
      stmt = i + 1;
    }
  }
  return hits;
}

void add(StaticReport& r, const Views& v, const Rule& rule, const char* severity, size_t pos) {
  int line = v.line[std::min(pos, v.line.size() - 1)];
  for (const auto& f : r.findings)
    if (f.rule == rule.id && f.line == line && f.severity == severity) return;
  std::string text = line >= 1 && line <= static_cast<int>(v.original.size()) ? trim(v.original[line - 1]) : "";
  r.findings.push_back({rule.id, severity, line, text, rule.why});
}

void check_includes(StaticReport& r, const Views& v, const Rule& rule, const Ctx& c) {
  static const std::regex kInclude(R"re(#\s*include\s*(<([^>\n]*)>|"([^"\n]*)"|[^\n]*))re");
  for (auto it = std::sregex_iterator(v.includes.begin(), v.includes.end(), kInclude); it != std::sregex_iterator(); ++it) {
    std::string name = (*it)[2].matched ? (*it)[2].str() : (*it)[3].matched ? (*it)[3].str() : "";
    bool ok;
    if (!c.cuda) ok = kCpuIncludes.count(name) > 0;
    else ok = kCudaIncludes.count(name) > 0 || name.rfind("cooperative_groups/", 0) == 0;
    if (!ok) add(r, v, rule, rule.severity, it->position());
  }
}

void check_int32_index(StaticReport& r, const Views& v, const Rule& rule, const Ctx& c) {
  // A 32-bit variable, or a 64-bit one whose initializer multiplies blockIdx by blockDim in 32 bits.
  static const std::regex kDecl(
      R"(\b(unsigned\s+int|unsigned|int|int32_t|uint32_t|uint|long\s+long|unsigned\s+long\s+long|int64_t|uint64_t|size_t|ptrdiff_t|long)\s+[A-Za-z_]\w*\s*=([^;]*))");
  static const std::regex k64(R"(long|int64_t|uint64_t|size_t|ptrdiff_t)");
  for (auto it = std::sregex_iterator(v.code.begin(), v.code.end(), kDecl); it != std::sregex_iterator(); ++it) {
    std::string init = (*it)[2].str();
    if (init.find("blockIdx") == std::string::npos || init.find("blockDim") == std::string::npos) continue;
    const bool wide_var = std::regex_search((*it)[1].str(), k64);
    if (wide_var && std::regex_search(init, k64)) continue;   // widened before the multiply
    const int64_t limit = wide_var ? int64_t{0xffffffff} : int64_t{0x7fffffff};
    add(r, v, rule, c.max_numel > limit ? "error" : "warning", it->position());
  }
}

}  // namespace

std::string StaticReport::first_error() const {
  for (const auto& f : findings)
    if (f.severity == "error") return f.rule + " at line " + std::to_string(f.line) + ": " + f.text;
  return "";
}

StaticReport static_check(const std::string& source, const OpCall& c) {
  std::vector<std::string> dtypes;
  int64_t max_numel = 0;
  for (const auto* list : {&c.inputs, &c.outputs})
    for (const auto& t : *list)
      if (t.defined) {
        dtypes.push_back(dtype_name(t.dtype));
        max_numel = std::max(max_numel, t.numel());
      }
  return static_check(source, c.backend, c.policy, dtypes, max_numel);
}

bool StaticReport::ok() const {
  return std::none_of(findings.begin(), findings.end(), [](const Finding& f) { return f.severity == "error"; });
}

nlohmann::json StaticReport::to_json() const {
  nlohmann::json list = nlohmann::json::array();
  int errors = 0;
  for (const auto& f : findings) {
    errors += f.severity == "error";
    list.push_back({{"rule", f.rule}, {"severity", f.severity}, {"line", f.line}, {"text", f.text}, {"why", f.why}});
  }
  return {{"ok", ok()}, {"errors", errors}, {"warnings", static_cast<int>(findings.size()) - errors}, {"findings", list}};
}

StaticReport static_check(const std::string& source, BackendKind backend, const std::string& policy,
                          const std::vector<std::string>& dtypes, int64_t max_numel) {
  Ctx c;
  c.cuda = backend == BackendKind::kCuda;
  c.policy = policy;
  c.max_numel = max_numel;
  c.has_f16 = std::count(dtypes.begin(), dtypes.end(), "f16") > 0;
  c.has_bf16 = std::count(dtypes.begin(), dtypes.end(), "bf16") > 0;
  c.float_data = dtypes.empty() || std::count(dtypes.begin(), dtypes.end(), "f32") > 0 ||
                 std::count(dtypes.begin(), dtypes.end(), "f64") > 0;
  const Views v = make_views(source);
  StaticReport r;
  for (const Rule& rule : std::span(kRules, kNumRules)) {
    if ((rule.back == Back::kCuda && !c.cuda) || (rule.back == Back::kCpu && c.cuda) || !applies(rule.when, c)) continue;
    switch (rule.check) {
      case Check::kRegex: {
        static const std::vector<std::regex> compiled = [] {
          std::vector<std::regex> out;
          for (const Rule& x : std::span(kRules, kNumRules)) out.emplace_back(x.pattern ? x.pattern : "$^", std::regex::ECMAScript | std::regex::optimize);
          return out;
        }();
        const std::regex& re = compiled[&rule - kRules];
        const std::string& view = rule.view == View::kCode ? v.code : v.quoted;
        for (auto it = std::sregex_iterator(view.begin(), view.end(), re); it != std::sregex_iterator(); ++it)
          add(r, v, rule, rule.severity, it->position());
        break;
      }
      case Check::kDeviceState:
        for (size_t pos : device_state(v, c)) add(r, v, rule, rule.severity, pos);
        break;
      case Check::kInclude: check_includes(r, v, rule, c); break;
      case Check::kInt32Index: check_int32_index(r, v, rule, c); break;
    }
  }
  std::stable_sort(r.findings.begin(), r.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.line < b.line; });
  return r;
}

}  // namespace kc::evolve
