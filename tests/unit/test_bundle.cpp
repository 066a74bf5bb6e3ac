// Bundles: export/import round trips, filters, and damaged bundles handled without harm.
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "kernel_cache/bundle.h"
#include "kernel_cache/key.h"
#include "kernel_cache/record.h"
#include "tests/unit/test_util.h"

namespace kc {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

Record make(const std::string& op, int n) {
  KeyBuilder k("cpu-x86_64+gcc-12.2.0", op.c_str(), "fp32");
  int64_t size = n, stride = 1;
  k.tensor("self", DType::kF32, &size, &stride, 1, 16);
  Record r;
  r.key = k.take();
  r.op = op;
  r.backend = "cpu";
  r.source = "// kernel " + std::to_string(n);
  r.blob = std::string("\0blob", 5) + std::to_string(n);
  return r;
}

std::unique_ptr<Store> writer(const std::string& dir) {
  auto st = Store::open(dir, Store::Mode::kWriter);
  EXPECT_TRUE(st) << st.status().to_string();
  return st ? std::move(st).value() : nullptr;
}

std::map<std::string, std::string> contents(Store& s) {
  std::map<std::string, std::string> m;
  EXPECT_TRUE(s.scan("", [&](const std::string& k, const std::string& v) { m[k] = v; return true; }).is_ok());
  return m;
}

std::string write_cbor(const std::string& path, const json& j) {
  std::string bytes;
  json::to_cbor(j, bytes);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

class Bundle : public ::testing::Test {
 protected:
  void SetUp() override {
    src = writer(t.path + "/src");
    ASSERT_TRUE(src);
    for (int i = 1; i <= 3; ++i) ASSERT_TRUE(src->put(make("aten::relu", i).key, encode_record(make("aten::relu", i))).is_ok());
    for (int i = 1; i <= 2; ++i) ASSERT_TRUE(src->put(make("aten::gelu", i).key, encode_record(make("aten::gelu", i))).is_ok());
  }
  TempDir t;
  std::unique_ptr<Store> src;
};

TEST_F(Bundle, RoundTripAll) {
  std::string file = t.path + "/all.kcb";
  auto ex = export_bundle(*src, file);
  ASSERT_TRUE(ex) << ex.status().to_string();
  EXPECT_EQ(ex->exported, 5u);
  EXPECT_EQ(ex->skipped, 0u);
  EXPECT_EQ(ex->bytes, fs::file_size(file));
  for (auto& e : fs::directory_iterator(t.path))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << "temporary left behind: " << e.path();

  auto dst = writer(t.path + "/dst");
  auto im = import_bundle(*dst, file);
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 5u);
  EXPECT_EQ(im->rejected, 0u);
  EXPECT_EQ(contents(*dst), contents(*src)) << "bytes must round-trip exactly";

  // Importing again changes nothing.
  auto again = import_bundle(*dst, file);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->imported, 0u);
  EXPECT_EQ(again->unchanged, 5u);
}

TEST_F(Bundle, HeaderCarriesVersion) {
  std::string file = t.path + "/h.kcb";
  ASSERT_TRUE(export_bundle(*src, file));
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j = json::from_cbor(bytes);
  EXPECT_EQ(j["magic"], "kernelcraft-bundle");
  EXPECT_EQ(j["version"], kBundleVersion);
  EXPECT_EQ(j["count"], 5);
  EXPECT_EQ(j["records"].size(), 5u);
}

TEST_F(Bundle, Filters) {
  std::string file = t.path + "/f.kcb";
  for (const char* op : {"gelu", "aten::gelu"}) {
    auto ex = export_bundle(*src, file, BundleFilter{"", op});
    ASSERT_TRUE(ex) << ex.status().to_string();
    EXPECT_EQ(ex->exported, 2u) << op;
  }
  auto by_key = export_bundle(*src, file, BundleFilter{"f32[3]", ""});
  ASSERT_TRUE(by_key);
  EXPECT_EQ(by_key->exported, 1u);
  auto none = export_bundle(*src, file, BundleFilter{"", "aten::tanh"});
  ASSERT_TRUE(none);
  EXPECT_EQ(none->exported, 0u);
  auto dst = writer(t.path + "/dst");
  auto im = import_bundle(*dst, file);
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 0u);
}

TEST_F(Bundle, ExportSkipsUndecodableValues) {
  ASSERT_TRUE(src->put("kc1|junk", "not a record").is_ok());
  auto ex = export_bundle(*src, t.path + "/s.kcb");
  ASSERT_TRUE(ex) << ex.status().to_string();
  EXPECT_EQ(ex->exported, 5u);
  EXPECT_EQ(ex->skipped, 1u);
  ASSERT_EQ(ex->errors.size(), 1u);
  EXPECT_NE(ex->errors[0].find("kc1|junk"), std::string::npos);
}

TEST_F(Bundle, ImportRejectsBadEntriesAndKeepsGoodOnes) {
  Record good = make("aten::tanh", 7), other = make("aten::tanh", 8);
  std::string enc = encode_record(good);
  auto bin = [](const std::string& s) { return json::binary(std::vector<uint8_t>(s.begin(), s.end())); };
  json j = {{"magic", "kernelcraft-bundle"}, {"version", kBundleVersion}, {"count", 5},
            {"records", json::array({
                {{"key", good.key}, {"value", bin(enc)}},
                {{"key", "kc1|x|aten::tanh|fp32|broken"}, {"value", bin(enc.substr(0, enc.size() / 2))}},
                {{"key", other.key}, {"value", bin(enc)}},            // record made for another key
                {{"key", "no value"}},
                42,
            })}};
  auto dst = writer(t.path + "/dst");
  auto im = import_bundle(*dst, write_cbor(t.path + "/bad.kcb", j));
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 1u);
  EXPECT_EQ(im->rejected, 4u);
  EXPECT_EQ(im->errors.size(), 4u);
  EXPECT_EQ(contents(*dst).size(), 1u);
  EXPECT_EQ(dst->get(good.key).value(), enc);
}

TEST_F(Bundle, OverwriteAndDryRun) {
  std::string file = t.path + "/o.kcb";
  ASSERT_TRUE(export_bundle(*src, file, BundleFilter{"", "relu"}));
  auto dst = writer(t.path + "/dst");
  Record mine = make("aten::relu", 1);
  mine.source = "// a different kernel for the same key";
  ASSERT_TRUE(dst->put(mine.key, encode_record(mine)).is_ok());

  auto dry = import_bundle(*dst, file, ImportOptions{true, true});
  ASSERT_TRUE(dry);
  EXPECT_EQ(dry->imported, 3u);
  EXPECT_EQ(contents(*dst).size(), 1u) << "dry run wrote";

  auto keep = import_bundle(*dst, file, ImportOptions{false, false});
  ASSERT_TRUE(keep);
  EXPECT_EQ(keep->kept, 1u);
  EXPECT_EQ(keep->imported, 2u);
  EXPECT_EQ(decode_record(dst->get(mine.key).value())->source, mine.source);

  auto over = import_bundle(*dst, file);
  ASSERT_TRUE(over);
  EXPECT_EQ(over->imported, 1u);
  EXPECT_EQ(over->unchanged, 2u);
  EXPECT_EQ(decode_record(dst->get(mine.key).value())->source, "// kernel 1");
}

TEST_F(Bundle, NotABundle) {
  auto dst = writer(t.path + "/dst");
  EXPECT_EQ(import_bundle(*dst, t.path + "/missing.kcb").status().code(), Code::kNotFound);
  std::ofstream(t.path + "/text.kcb") << "hello";
  EXPECT_EQ(import_bundle(*dst, t.path + "/text.kcb").status().code(), Code::kCorrupt);
  EXPECT_EQ(import_bundle(*dst, write_cbor(t.path + "/m.kcb", json{{"version", 1}})).status().code(), Code::kCorrupt);
  json future = {{"magic", "kernelcraft-bundle"}, {"version", kBundleVersion + 1}, {"records", json::array()}};
  EXPECT_EQ(import_bundle(*dst, write_cbor(t.path + "/v.kcb", future)).status().code(), Code::kUnsupported);
  // Truncated copy of a real bundle.
  std::string file = t.path + "/all.kcb";
  ASSERT_TRUE(export_bundle(*src, file));
  fs::resize_file(file, fs::file_size(file) / 2);
  EXPECT_EQ(import_bundle(*dst, file).status().code(), Code::kCorrupt);
  EXPECT_TRUE(contents(*dst).empty());
}

TEST_F(Bundle, ImportNeedsAWriterAndExportNeedsAWritablePath) {
  auto ro = Store::open(t.path + "/src", Store::Mode::kReadOnly);
  ASSERT_TRUE(ro) << ro.status().to_string();
  std::string file = t.path + "/r.kcb";
  ASSERT_TRUE(export_bundle(*ro.value(), file)) << "export works from a read-only store";
  EXPECT_EQ(import_bundle(*ro.value(), file).status().code(), Code::kInvalid);
  EXPECT_EQ(export_bundle(*src, t.path + "/no/such/dir/x.kcb").status().code(), Code::kIOError);
}

}  // namespace
}  // namespace kc
