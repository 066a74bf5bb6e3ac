// Recursive-descent evaluator for the int64 expressions of launch specs (grammar in expr.h).
#include "runtime/expr.h"

#include <cctype>
#include <cstdint>
#include <limits>
#include <vector>

namespace kc {
namespace {

// Specs come from proposers (including LLMs): bound the nesting so a hostile string cannot
// exhaust the stack of the serving thread.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  // b == nullptr: syntax check only (names and functions are accepted, values are dummies).
  Parser(const std::string& text, const Binding* b) : s_(text), b_(b) {}

  Result<int64_t> run() {
    int64_t v = 0;
    if (!expr(v)) return err_;
    skip_ws();
    if (pos_ != s_.size()) {
      fail_at(pos_, "unexpected '" + std::string(1, s_[pos_]) + "'");
      return err_;
    }
    return v;
  }

 private:
  // Every parse function returns false after recording the first error in err_.
  bool fail_at(size_t at, const std::string& what) {
    if (err_.is_ok())
      err_ = Status::error(Code::kInvalid, what + " at position " + std::to_string(at) +
                                               " in expression '" + s_ + "'");
    return false;
  }

  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool peek(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool expect(char c) {
    if (peek(c)) {
      ++pos_;
      return true;
    }
    std::string got = pos_ < s_.size() ? "'" + std::string(1, s_[pos_]) + "'" : "end of input";
    return fail_at(pos_, std::string("expected '") + c + "', found " + got);
  }

  bool overflow(size_t at) { return fail_at(at, "int64 overflow"); }

  bool expr(int64_t& out) {
    if (++depth_ > kMaxDepth) return fail_at(pos_, "expression nested too deeply");
    bool ok = sum(out);
    --depth_;
    return ok;
  }

  bool sum(int64_t& out) {
    if (!product(out)) return false;
    while (peek('+') || peek('-')) {
      size_t at = pos_;
      char op = s_[pos_++];
      int64_t r;
      if (!product(r)) return false;
      bool ovf = op == '+' ? __builtin_add_overflow(out, r, &out) : __builtin_sub_overflow(out, r, &out);
      if (ovf) return overflow(at);
    }
    return true;
  }

  bool product(int64_t& out) {
    if (!unary(out)) return false;
    while (peek('*') || peek('/') || peek('%')) {
      size_t at = pos_;
      char op = s_[pos_++];
      int64_t r;
      if (!unary(r)) return false;
      if (op == '*') {
        if (__builtin_mul_overflow(out, r, &out)) return overflow(at);
        continue;
      }
      if (!b_) continue;  // syntax check: values are dummies, so no division checks
      if (r == 0) return fail_at(at, op == '/' ? "division by zero" : "modulo by zero");
      if (out == std::numeric_limits<int64_t>::min() && r == -1) return overflow(at);
      out = op == '/' ? out / r : out % r;
    }
    return true;
  }

  bool unary(int64_t& out) {
    if (peek('-') || peek('+')) {
      size_t at = pos_;
      char op = s_[pos_++];
      if (++depth_ > kMaxDepth) return fail_at(at, "expression nested too deeply");
      bool ok = unary(out);
      --depth_;
      if (!ok) return false;
      if (op == '-' && __builtin_sub_overflow(int64_t{0}, out, &out)) return overflow(at);
      return true;
    }
    return primary(out);
  }

  bool primary(int64_t& out) {
    skip_ws();
    if (pos_ >= s_.size()) return fail_at(pos_, "unexpected end of expression");
    char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      return expr(out) && expect(')');
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return number(out);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t at = pos_;
      std::string name = ident();
      if (peek('(')) {
        ++pos_;
        return call(name, at, out);
      }
      return scalar(name, at, out);
    }
    return fail_at(pos_, "unexpected '" + std::string(1, c) + "'");
  }

  bool number(int64_t& out) {
    size_t at = pos_;
    out = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      int d = s_[pos_++] - '0';
      if (__builtin_mul_overflow(out, int64_t{10}, &out) || __builtin_add_overflow(out, d, &out))
        return fail_at(at, "integer literal out of int64 range");
    }
    if (pos_ < s_.size() && (std::isalpha(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' || s_[pos_] == '_'))
      return fail_at(pos_, "only decimal integer literals are allowed");
    return true;
  }

  std::string ident() {
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  bool scalar(const std::string& name, size_t at, int64_t& out) {
    out = 1;
    if (!b_) return true;
    const ScalarArg* a = b_->scalar(name);
    if (!a) {
      if (b_->tensor(name)) return fail_at(at, "tensor '" + name + "' used as a number (use numel/size)");
      return fail_at(at, "unknown scalar '" + name + "'");
    }
    if (auto* i = std::get_if<int64_t>(&a->value)) {
      out = *i;
      return true;
    }
    if (auto* bv = std::get_if<bool>(&a->value)) {
      out = *bv ? 1 : 0;
      return true;
    }
    return fail_at(at, "scalar '" + name + "' is not an int or bool");
  }

  // Tensor-valued first argument of numel/size/stride/dim.
  bool tensor_arg(const TensorMeta*& t) {
    skip_ws();
    size_t at = pos_;
    if (pos_ >= s_.size() || !(std::isalpha(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_'))
      return fail_at(at, "expected a tensor name");
    std::string name = ident();
    t = nullptr;
    if (!b_) return true;
    t = b_->tensor(name);
    if (!t) return fail_at(at, "unknown tensor '" + name + "'");
    if (!t->defined) return fail_at(at, "tensor '" + name + "' is undefined (absent optional)");
    return true;
  }

  bool dim_index(const TensorMeta* t, const std::vector<int64_t>& v, int64_t i, size_t at, int64_t& out) {
    out = 1;
    if (!b_) return true;
    int64_t n = static_cast<int64_t>(v.size());
    int64_t k = i < 0 ? i + n : i;
    if (k < 0 || k >= n)
      return fail_at(at, "dimension " + std::to_string(i) + " out of range for tensor '" + t->name +
                             "' with " + std::to_string(n) + " dims");
    out = v[static_cast<size_t>(k)];
    return true;
  }

  bool call(const std::string& fn, size_t at, int64_t& out) {
    if (fn == "numel" || fn == "dim") {
      const TensorMeta* t;
      if (!tensor_arg(t) || !expect(')')) return false;
      out = 1;
      if (!t) return true;
      if (fn == "dim") {
        out = static_cast<int64_t>(t->sizes.size());
        return true;
      }
      for (int64_t s : t->sizes)
        if (__builtin_mul_overflow(out, s, &out)) return overflow(at);
      return true;
    }
    if (fn == "size" || fn == "stride") {
      const TensorMeta* t;
      if (!tensor_arg(t) || !expect(',')) return false;
      skip_ws();
      size_t iat = pos_;
      int64_t i;
      if (!expr(i) || !expect(')')) return false;
      if (t && fn == "stride" && t->strides.size() != t->sizes.size())
        return fail_at(at, "tensor '" + t->name + "' has no strides");
      return dim_index(t, fn == "size" ? (t ? t->sizes : empty_) : (t ? t->strides : empty_), i, iat, out);
    }
    if (fn == "ceil_div" || fn == "min" || fn == "max") {
      int64_t a, b;
      if (!expr(a) || !expect(',')) return false;
      skip_ws();
      size_t bat = pos_;
      if (!expr(b) || !expect(')')) return false;
      if (fn == "min") out = a < b ? a : b;
      else if (fn == "max") out = a > b ? a : b;
      else {
        out = 1;
        if (!b_) return true;
        if (b == 0) return fail_at(bat, "ceil_div by zero");
        if (a == std::numeric_limits<int64_t>::min() && b == -1) return overflow(at);
        // Division that rounds towards +infinity for every sign combination.
        out = a / b;
        if (a % b != 0 && ((a < 0) == (b < 0))) ++out;
      }
      return true;
    }
    return fail_at(at, "unknown function '" + fn + "' (numel, size, stride, dim, ceil_div, min, max)");
  }

  const std::string& s_;
  const Binding* b_;
  size_t pos_ = 0;
  int depth_ = 0;
  Status err_;
  const std::vector<int64_t> empty_;
};

}  // namespace

Result<int64_t> eval_int_expr(const std::string& text, const Binding& b) {
  return Parser(text, &b).run();
}

Status check_int_expr(const std::string& text) {
  Result<int64_t> r = Parser(text, nullptr).run();
  return r.is_ok() ? Status::ok() : r.status();
}

}  // namespace kc
