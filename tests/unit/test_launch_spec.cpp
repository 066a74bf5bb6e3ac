// Launch specs: JSON parsing and validation, round trips, and resolution against a binding.
#include <gtest/gtest.h>

#include "runtime/launch_spec.h"

namespace kc {
namespace {

using nlohmann::json;

Binding softmax_binding() {
  Binding b;
  TensorMeta self;
  self.name = "self";
  self.sizes = {64, 1000};
  self.strides = {1000, 1};
  TensorMeta out = self;
  out.name = "out0";
  TensorMeta bias;
  bias.name = "bias";
  bias.defined = false;
  b.tensors = {self, bias, out};
  b.scalars.push_back({"eps", ScalarValue{1e-5}});
  b.scalars.push_back({"dim", ScalarValue{int64_t{-1}}});
  b.scalars.push_back({"half", ScalarValue{false}});
  b.scalars.push_back({"name", ScalarValue{std::string("x")}});
  return b;
}

json softmax_spec() {
  return json::parse(R"J({"version": 1,
    "launches": [{"entry": "kc_softmax", "grid": ["size(self,0)", 1, 1], "block": [256],
                  "smem": "size(self,-1) * 4",
                  "args": ["ptr:out0", "ptr:self", "i64:size(self,-1)", "i32:size(self, dim)",
                           "f32:eps", "f64:0.5", "ptr:partial"]},
                 {"entry": "kc_fixup", "grid": [1], "block": [32, 2, 1], "args": ["ptr:partial", "f32:dim"]}],
    "scratch": [{"name": "partial", "bytes": "size(self,0) * 8"}]})J");
}

Status parse_error(const json& j) {
  auto r = parse_launch_spec(j);
  EXPECT_FALSE(r.is_ok()) << j.dump();
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  return r.status();
}

TEST(LaunchSpec, ParsesIntsAndStrings) {
  auto r = parse_launch_spec(softmax_spec());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const LaunchSpec& s = r.value();
  ASSERT_EQ(s.launches.size(), 2u);
  EXPECT_EQ(s.launches[0].entry, "kc_softmax");
  EXPECT_EQ(s.launches[0].grid[0], "size(self,0)");
  EXPECT_EQ(s.launches[0].grid[1], "1");
  EXPECT_EQ(s.launches[0].block[0], "256");
  EXPECT_EQ(s.launches[0].block[1], "1");   // missing dimensions default to 1
  EXPECT_EQ(s.launches[0].block[2], "1");
  EXPECT_EQ(s.launches[1].smem, "0");       // smem defaults to 0
  ASSERT_EQ(s.scratch.size(), 1u);
  EXPECT_EQ(s.scratch[0].bytes, "size(self,0) * 8");
}

TEST(LaunchSpec, RoundTripsThroughJson) {
  auto a = parse_launch_spec(softmax_spec());
  ASSERT_TRUE(a.is_ok());
  json j = to_json(a.value());
  EXPECT_TRUE(j["launches"][0]["block"][0].is_number_integer());  // canonical ints stay ints
  EXPECT_TRUE(j["launches"][0]["grid"][0].is_string());
  auto b = parse_launch_spec(j);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(to_json(b.value()), j);
}

TEST(LaunchSpec, RejectsMalformedSpecs) {
  EXPECT_NE(parse_error(json::array()).message().find("object"), std::string::npos);
  json j = softmax_spec();
  j["version"] = 2;
  EXPECT_NE(parse_error(j).message().find("version"), std::string::npos);
  j = softmax_spec();
  j["launches"] = json::array();
  EXPECT_NE(parse_error(j).message().find("non-empty"), std::string::npos);
  j = softmax_spec();
  j.erase("launches");
  parse_error(j).ignore();
  j = softmax_spec();
  j["launches"][0]["args"][0] = "ptr16:out0";
  EXPECT_NE(parse_error(j).message().find("unknown kind 'ptr16'"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][0] = "out0";
  EXPECT_NE(parse_error(j).message().find("kind:what"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][2] = "i64:size(self,";
  EXPECT_NE(parse_error(j).message().find("args[2]"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["grid"] = {1, 2, 3, 4};
  EXPECT_NE(parse_error(j).message().find("1 to 3"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["grid"][0] = 1.5;
  EXPECT_NE(parse_error(j).message().find("grid[0]"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["entry"] = "not an identifier";
  EXPECT_NE(parse_error(j).message().find("entry"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["gird"] = {1};
  EXPECT_NE(parse_error(j).message().find("unknown key \"gird\""), std::string::npos);
  j = softmax_spec();
  j["scratch"].push_back({{"name", "partial"}, {"bytes", 4}});
  EXPECT_NE(parse_error(j).message().find("duplicate"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["smem"] = "4 +";
  EXPECT_NE(parse_error(j).message().find("smem"), std::string::npos);
}

TEST(LaunchSpec, ResolvesAgainstTheBinding) {
  auto s = parse_launch_spec(softmax_spec());
  ASSERT_TRUE(s.is_ok());
  auto r = resolve(s.value(), softmax_binding());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ResolvedSpec& rs = r.value();
  EXPECT_EQ(rs.num_tensor_slots, 3);
  ASSERT_EQ(rs.scratch_bytes.size(), 1u);
  EXPECT_EQ(rs.scratch_bytes[0], 64 * 8);
  EXPECT_EQ(rs.num_slots(), 4);
  const ResolvedLaunch& l = rs.launches[0];
  EXPECT_EQ(l.grid[0], 64);
  EXPECT_EQ(l.block[0], 256);
  EXPECT_EQ(l.block[2], 1);
  EXPECT_EQ(l.smem, 4000);
  ASSERT_EQ(l.params.size(), 7u);
  EXPECT_EQ(l.params[0].kind, Param::Kind::kPtr);
  EXPECT_EQ(l.params[0].slot, 2);   // out0 is the third tensor
  EXPECT_EQ(l.params[1].slot, 0);
  EXPECT_EQ(l.params[2].kind, Param::Kind::kI64);
  EXPECT_EQ(l.params[2].imm.i64, 1000);
  EXPECT_EQ(l.params[3].kind, Param::Kind::kI32);
  EXPECT_EQ(l.params[3].imm.i32, 1000);
  EXPECT_EQ(l.params[4].kind, Param::Kind::kF32);
  EXPECT_FLOAT_EQ(l.params[4].imm.f32, 1e-5f);
  EXPECT_EQ(l.params[5].kind, Param::Kind::kF64);
  EXPECT_DOUBLE_EQ(l.params[5].imm.f64, 0.5);
  EXPECT_EQ(l.params[6].slot, 3);   // the scratch buffer after the tensors
  EXPECT_FLOAT_EQ(rs.launches[1].params[1].imm.f32, -1.0f);   // an int scalar as a float
  EXPECT_EQ(rs.launches[1].block[1], 2);
}

Status resolve_error(json j, const Binding& b = softmax_binding()) {
  auto s = parse_launch_spec(j);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return s.status();
  auto r = resolve(s.value(), b);
  EXPECT_FALSE(r.is_ok()) << j.dump();
  EXPECT_EQ(r.status().code(), Code::kInvalid);
  return r.status();
}

TEST(LaunchSpec, ResolveRejectsWhatTheKeyCannotSatisfy) {
  json j = softmax_spec();
  j["launches"][0]["args"][1] = "ptr:bias";
  EXPECT_NE(resolve_error(j).message().find("undefined"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][1] = "ptr:nothing";
  EXPECT_NE(resolve_error(j).message().find("no tensor or scratch buffer named 'nothing'"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["grid"][0] = "size(self,0) - 64";
  EXPECT_NE(resolve_error(j).message().find("positive"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["block"][1] = -1;
  EXPECT_NE(resolve_error(j).message().find("positive"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["smem"] = "-4";
  EXPECT_NE(resolve_error(j).message().find("negative smem"), std::string::npos);
  j = softmax_spec();
  j["scratch"][0]["bytes"] = -1;
  EXPECT_NE(resolve_error(j).message().find("negative size"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][3] = "i32:numel(self) * 100000";
  EXPECT_NE(resolve_error(j).message().find("does not fit in i32"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][4] = "f32:1e300";
  EXPECT_NE(resolve_error(j).message().find("does not fit in f32"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][4] = "f32:epsilon";
  EXPECT_NE(resolve_error(j).message().find("neither a float scalar"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][4] = "f64:name";
  EXPECT_NE(resolve_error(j).message().find("not a float or int"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["args"][2] = "i64:eps";
  EXPECT_NE(resolve_error(j).message().find("not an int"), std::string::npos);
  j = softmax_spec();
  j["launches"][0]["grid"][0] = "size(self, 2)";
  EXPECT_NE(resolve_error(j).message().find("launches[0] (kc_softmax).grid[0]"), std::string::npos);
  j = softmax_spec();
  j["scratch"][0]["name"] = "self";
  EXPECT_NE(resolve_error(j).message().find("name of a tensor"), std::string::npos);
}

TEST(LaunchSpec, BoolScalarsAndLiterals) {
  json j = json::parse(R"J({"launches": [{"entry": "k", "grid": ["1 + half"], "block": [1],
                                         "args": ["i32:half", "f64:-2.5e-3", "f32:inf"]}]})J");
  auto s = parse_launch_spec(j);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->version, 1);   // a missing version means 1
  auto r = resolve(s.value(), softmax_binding());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->launches[0].grid[0], 1);
  EXPECT_EQ(r->launches[0].params[0].imm.i32, 0);
  EXPECT_DOUBLE_EQ(r->launches[0].params[1].imm.f64, -2.5e-3);
  EXPECT_TRUE(std::isinf(r->launches[0].params[2].imm.f32));
}

}  // namespace
}  // namespace kc
