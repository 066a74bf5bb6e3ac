// Launch-spec expressions: arithmetic, functions over the binding, and every error with its position.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "runtime/expr.h"

namespace kc {
namespace {

Binding sample() {
  Binding b;
  TensorMeta x;
  x.name = "self";
  x.sizes = {4, 8, 32};
  x.strides = {256, 32, 1};
  b.tensors.push_back(x);
  TensorMeta opt;
  opt.name = "weight";
  opt.defined = false;
  b.tensors.push_back(opt);
  b.scalars.push_back({"dim", ScalarValue{int64_t{-1}}});
  b.scalars.push_back({"flag", ScalarValue{true}});
  b.scalars.push_back({"eps", ScalarValue{1e-5}});
  return b;
}

int64_t ev(const std::string& e) {
  auto r = eval_int_expr(e, sample());
  EXPECT_TRUE(r.is_ok()) << e << ": " << r.status().to_string();
  return r.is_ok() ? r.value() : -999;
}

Status err(const std::string& e) {
  auto r = eval_int_expr(e, sample());
  EXPECT_FALSE(r.is_ok()) << e << " evaluated to " << (r.is_ok() ? r.value() : 0);
  return r.status();
}

TEST(Expr, Arithmetic) {
  EXPECT_EQ(ev("42"), 42);
  EXPECT_EQ(ev("1 + 2 * 3"), 7);
  EXPECT_EQ(ev("(1 + 2) * 3"), 9);
  EXPECT_EQ(ev("7 / 2"), 3);
  EXPECT_EQ(ev("-7 / 2"), -3);   // C truncation
  EXPECT_EQ(ev("-7 % 3"), -1);
  EXPECT_EQ(ev("--3"), 3);
  EXPECT_EQ(ev("+3 - -3"), 6);
  EXPECT_EQ(ev("10 - 2 - 3"), 5);  // left associative
  EXPECT_EQ(ev("  2*  (3 +4 ) "), 14);
}

TEST(Expr, FunctionsOverTheBinding) {
  EXPECT_EQ(ev("numel(self)"), 1024);
  EXPECT_EQ(ev("dim(self)"), 3);
  EXPECT_EQ(ev("size(self, 0)"), 4);
  EXPECT_EQ(ev("size(self,-1)"), 32);
  EXPECT_EQ(ev("size(self, dim)"), 32);
  EXPECT_EQ(ev("stride(self, 0)"), 256);
  EXPECT_EQ(ev("stride(self, 1 - 3)"), 32);
  EXPECT_EQ(ev("ceil_div(numel(self), 256)"), 4);
  EXPECT_EQ(ev("ceil_div(1025, 256)"), 5);
  EXPECT_EQ(ev("ceil_div(-5, 2)"), -2);
  EXPECT_EQ(ev("ceil_div(5, -2)"), -2);
  EXPECT_EQ(ev("ceil_div(-5, -2)"), 3);
  EXPECT_EQ(ev("min(size(self,0), 3)"), 3);
  EXPECT_EQ(ev("max(size(self,0), 3) * flag"), 4);
  EXPECT_EQ(ev("numel(self) / size(self, -1)"), 32);
}

TEST(Expr, ErrorsCarryThePosition) {
  Status s = err("1 + ");
  EXPECT_EQ(s.code(), Code::kInvalid);
  EXPECT_NE(s.message().find("position 4"), std::string::npos) << s.message();
  s = err("size(self, 3)");
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("position 11"), std::string::npos) << s.message();
  s = err("numel(x)");
  EXPECT_NE(s.message().find("unknown tensor 'x'"), std::string::npos) << s.message();
  s = err("n * 2");
  EXPECT_NE(s.message().find("unknown scalar 'n'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("position 0"), std::string::npos) << s.message();
  s = err("4 / (2 - 2)");
  EXPECT_NE(s.message().find("division by zero"), std::string::npos) << s.message();
  s = err("4 % 0");
  EXPECT_NE(s.message().find("modulo by zero"), std::string::npos) << s.message();
  s = err("ceil_div(4, 0)");
  EXPECT_NE(s.message().find("ceil_div by zero"), std::string::npos) << s.message();
  s = err("foo(1)");
  EXPECT_NE(s.message().find("unknown function 'foo'"), std::string::npos) << s.message();
  s = err("eps + 1");
  EXPECT_NE(s.message().find("not an int"), std::string::npos) << s.message();
  s = err("self + 1");
  EXPECT_NE(s.message().find("used as a number"), std::string::npos) << s.message();
  s = err("numel(weight)");
  EXPECT_NE(s.message().find("undefined"), std::string::npos) << s.message();
  s = err("(1 + 2");
  EXPECT_NE(s.message().find("expected ')'"), std::string::npos) << s.message();
  s = err("1 2");
  EXPECT_NE(s.message().find("unexpected '2'"), std::string::npos) << s.message();
  s = err("1.5");
  EXPECT_NE(s.message().find("integer"), std::string::npos) << s.message();
  s = err("");
  EXPECT_NE(s.message().find("end of expression"), std::string::npos) << s.message();
  s = err("min(1)");
  EXPECT_NE(s.message().find("expected ','"), std::string::npos) << s.message();
  s = err("1 $ 2");
  EXPECT_NE(s.message().find("'$'"), std::string::npos) << s.message();
}

TEST(Expr, OverflowIsAnErrorNotUndefinedBehaviour) {
  EXPECT_EQ(ev("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_NE(err("9223372036854775808").message().find("out of int64 range"), std::string::npos);
  EXPECT_NE(err("9223372036854775807 + 1").message().find("overflow"), std::string::npos);
  EXPECT_NE(err("4611686018427387904 * 2").message().find("overflow"), std::string::npos);
  EXPECT_NE(err("-9223372036854775807 - 2").message().find("overflow"), std::string::npos);
  EXPECT_NE(err("(-9223372036854775807 - 1) / -1").message().find("overflow"), std::string::npos);
  EXPECT_NE(err("-(-9223372036854775807 - 1)").message().find("overflow"), std::string::npos);
}

TEST(Expr, DeepNestingIsRejected) {
  std::string deep(200, '(');
  deep += "1" + std::string(200, ')');
  EXPECT_NE(err(deep).message().find("nested too deeply"), std::string::npos);
  std::string neg(200, '-');
  neg += "1";
  EXPECT_NE(err(neg).message().find("nested too deeply"), std::string::npos);
  std::string ok(20, '(');
  ok += "1" + std::string(20, ')');
  EXPECT_EQ(ev(ok), 1);
}

TEST(Expr, SyntaxCheckWithoutBinding) {
  EXPECT_TRUE(check_int_expr("ceil_div(numel(self), 256) + n").is_ok());
  EXPECT_TRUE(check_int_expr("size(x, -1) / 0").is_ok());  // values are unknown without a binding
  EXPECT_FALSE(check_int_expr("size(x -1)").is_ok());
  EXPECT_FALSE(check_int_expr("numel(3)").is_ok());
  EXPECT_FALSE(check_int_expr("bogus(1)").is_ok());
  EXPECT_FALSE(check_int_expr("1 +").is_ok());
}

}  // namespace
}  // namespace kc
