// Bundles: export/import round trips, filters, damaged bundles handled without harm, and the
// trust boundary: rebuilt binaries compared by hash, signatures, unbacked "verified" claims.
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "kernel_cache/bundle.h"
#include "kernel_cache/bundle_trust.h"
#include "kernel_cache/key.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "runtime/cpu_backend.h"
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
  r.backend = BackendKind::kCpu;
  r.source = "// kernel " + std::to_string(n);
  r.blob = std::string("\0blob", 5) + std::to_string(n);
  return r;
}

// Stands in for the compiler: make()'s blob is a function of its source, as a real build is.
Result<std::string> fake_build(const Record& r) { return std::string("\0blob", 5) + r.source.substr(10); }

ImportOptions opts(bool overwrite = true, bool dry_run = false) {
  ImportOptions o;
  o.overwrite = overwrite;
  o.dry_run = dry_run;
  o.checks.rebuild = fake_build;
  return o;
}

Result<ImportStats> import(Store& dst, const std::string& file, ImportOptions o = opts()) {
  return import_bundle(dst, file, o);
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
  auto im = import(*dst, file);
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 5u);
  EXPECT_EQ(im->rejected, 0u);
  EXPECT_EQ(contents(*dst), contents(*src)) << "bytes must round-trip exactly";

  // Importing again changes nothing.
  auto again = import(*dst, file);
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
  EXPECT_FALSE(j.contains("signature"));
  const auto& raw = j["payload"].get_binary();
  json p = json::from_cbor(std::vector<uint8_t>(raw.begin(), raw.end()));
  EXPECT_EQ(p["count"], 5);
  ASSERT_EQ(p["records"].size(), 5u);
  for (const auto& e : p["records"]) {
    EXPECT_EQ(e["binary"]["blake2b"].get<std::string>().size(), 64u);
    const auto& rb = e["record"].get_binary();
    auto rec = decode_record(std::string(rb.begin(), rb.end()));
    ASSERT_TRUE(rec);
    EXPECT_TRUE(rec->blob.empty()) << "a bundle carries no binaries";
  }
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
  auto im = import(*dst, file);
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
  json j = {{"magic", "kernelcraft-bundle"}, {"version", 1}, {"count", 5},   // version 1 is still read
            {"records", json::array({
                {{"key", good.key}, {"value", bin(enc)}},
                {{"key", "kc1|x|aten::tanh|fp32|broken"}, {"value", bin(enc.substr(0, enc.size() / 2))}},
                {{"key", other.key}, {"value", bin(enc)}},            // record made for another key
                {{"key", "no value"}},
                42,
            })}};
  auto dst = writer(t.path + "/dst");
  auto im = import(*dst, write_cbor(t.path + "/bad.kcb", j));
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

  auto dry = import(*dst, file, opts(true, true));
  ASSERT_TRUE(dry);
  EXPECT_EQ(dry->imported, 3u);
  EXPECT_EQ(contents(*dst).size(), 1u) << "dry run wrote";

  auto keep = import(*dst, file, opts(false, false));
  ASSERT_TRUE(keep);
  EXPECT_EQ(keep->kept, 1u);
  EXPECT_EQ(keep->imported, 2u);
  EXPECT_EQ(decode_record(dst->get(mine.key).value())->source, mine.source);

  auto over = import(*dst, file);
  ASSERT_TRUE(over);
  EXPECT_EQ(over->imported, 1u);
  EXPECT_EQ(over->unchanged, 2u);
  EXPECT_EQ(decode_record(dst->get(mine.key).value())->source, "// kernel 1");
}

TEST_F(Bundle, NotABundle) {
  auto dst = writer(t.path + "/dst");
  EXPECT_EQ(import(*dst, t.path + "/missing.kcb").status().code(), Code::kNotFound);
  std::ofstream(t.path + "/text.kcb") << "hello";
  EXPECT_EQ(import(*dst, t.path + "/text.kcb").status().code(), Code::kCorrupt);
  EXPECT_EQ(import(*dst, write_cbor(t.path + "/m.kcb", json{{"version", 1}})).status().code(), Code::kCorrupt);
  json future = {{"magic", "kernelcraft-bundle"}, {"version", kBundleVersion + 1}, {"records", json::array()}};
  EXPECT_EQ(import(*dst, write_cbor(t.path + "/v.kcb", future)).status().code(), Code::kUnsupported);
  // Truncated copy of a real bundle.
  std::string file = t.path + "/all.kcb";
  ASSERT_TRUE(export_bundle(*src, file));
  fs::resize_file(file, fs::file_size(file) / 2);
  EXPECT_EQ(import(*dst, file).status().code(), Code::kCorrupt);
  EXPECT_TRUE(contents(*dst).empty());
}

TEST_F(Bundle, ImportNeedsAWriterAndExportNeedsAWritablePath) {
  auto ro = Store::open(t.path + "/src", Store::Mode::kReadOnly);
  ASSERT_TRUE(ro) << ro.status().to_string();
  std::string file = t.path + "/r.kcb";
  ASSERT_TRUE(export_bundle(*ro.value(), file)) << "export works from a read-only store";
  EXPECT_EQ(import(*ro.value(), file).status().code(), Code::kInvalid);
  EXPECT_EQ(export_bundle(*src, t.path + "/no/such/dir/x.kcb").status().code(), Code::kIOError);
}


// Rewrites a version 2 bundle's payload through `edit` (keeps the signature block as it was).
void edit_payload(const std::string& file, const std::function<void(json&)>& edit) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  json j = json::from_cbor(bytes);
  const auto& raw = j["payload"].get_binary();
  json p = json::from_cbor(std::vector<uint8_t>(raw.begin(), raw.end()));
  edit(p);
  std::vector<uint8_t> out = json::to_cbor(p);
  j["payload"] = json::binary(out);
  write_cbor(file, j);
}

// Applies `edit` to the first record of the payload.
void edit_first_record(json& p, const std::function<void(Record&)>& edit) {
  const auto& rb = p["records"][0]["record"].get_binary();
  auto rec = decode_record(std::string(rb.begin(), rb.end()));
  ASSERT_TRUE(rec);
  edit(rec.value());
  std::string enc = encode_record(rec.value());
  p["records"][0]["record"] = json::binary(std::vector<uint8_t>(enc.begin(), enc.end()));
}

class BundleTrust : public Bundle {
 protected:
  void SetUp() override {
    Bundle::SetUp();
    Record v = make("aten::tanh", 9);
    v.meta["provenance"] = {{"by", "kernelcraft worker"}, {"verified", true}};
    ASSERT_TRUE(src->put(v.key, encode_record(v)).is_ok());
    verified_key = v.key;
    auto kp = generate_key_pair();
    ASSERT_TRUE(kp);
    keys = kp.value();
    auto other_kp = generate_key_pair();
    ASSERT_TRUE(other_kp);
    other = other_kp.value();
  }
  std::string verified_key;
  KeyPair keys, other;
};

TEST_F(BundleTrust, TamperedSourceOrHashIsRefusedAndTheRestImported) {
  std::string file = t.path + "/t.kcb";
  ASSERT_TRUE(export_bundle(*src, file, BundleFilter{"", "relu"}));
  edit_payload(file, [](json& p) { edit_first_record(p, [](Record& r) { r.source = "// kernel 5"; }); });
  auto dst = writer(t.path + "/dst");
  auto im = import(*dst, file);
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 2u);
  EXPECT_EQ(im->rejected, 1u);
  ASSERT_EQ(im->errors.size(), 1u);
  EXPECT_NE(im->errors[0].find("differs from the exporter's"), std::string::npos) << im->errors[0];

  // A swapped binary: its hash no longer matches what the source builds to.
  std::string file2 = t.path + "/t2.kcb";
  ASSERT_TRUE(export_bundle(*src, file2, BundleFilter{"", "relu"}));
  edit_payload(file2, [](json& p) { p["records"][1]["binary"]["blake2b"] = binary_hash("another binary"); });
  auto dst2 = writer(t.path + "/dst2");
  auto im2 = import(*dst2, file2);
  ASSERT_TRUE(im2);
  EXPECT_EQ(im2->rejected, 1u);
  EXPECT_EQ(contents(*dst2).size(), 2u);
}

TEST_F(BundleTrust, AVerifiedClaimNeedsATrustedSignatureOrTheGauntlet) {
  std::string file = t.path + "/u.kcb";
  ASSERT_TRUE(export_bundle(*src, file, BundleFilter{"", "tanh"}));
  auto dst = writer(t.path + "/dst");
  auto unsigned_im = import(*dst, file);
  ASSERT_TRUE(unsigned_im);
  EXPECT_EQ(unsigned_im->imported, 0u);
  EXPECT_EQ(unsigned_im->rejected, 1u);
  EXPECT_NE(unsigned_im->errors[0].find("claims to be verified"), std::string::npos) << unsigned_im->errors[0];

  // --reverify: the gauntlet decides (here a stand-in that rejects, then one that passes).
  ImportOptions o = opts();
  o.checks.reverify = [](const Record&) -> Result<json> { return Status::error(Code::kRejected, "numerics: wrong"); };
  auto rejected = import(*dst, file, o);
  ASSERT_TRUE(rejected);
  EXPECT_EQ(rejected->rejected, 1u);
  EXPECT_NE(rejected->errors[0].find("rejected by the gauntlet here: numerics: wrong"), std::string::npos);
  o.checks.reverify = [](const Record& r) -> Result<json> {
    EXPECT_EQ(r.blob, fake_build(r).value()) << "the gauntlet judges the local build";
    return json{{"stages", json::array()}};
  };
  auto passed = import(*dst, file, o);
  ASSERT_TRUE(passed);
  EXPECT_EQ(passed->imported, 1u);
  EXPECT_EQ(passed->reverified, 1u);
  auto stored = decode_record(dst->get(verified_key).value());
  EXPECT_TRUE(stored->meta["provenance"]["reverified_on_import"].get<bool>());
}

TEST_F(BundleTrust, SignedBundlesFromTrustedKeysOnly) {
  std::string file = t.path + "/s.kcb";
  ASSERT_TRUE(export_bundle(*src, file, BundleFilter{}, keys.secret_key));
  auto dst = writer(t.path + "/dst");
  ImportOptions trusted = opts();
  trusted.trusted_keys = {keys.public_key};
  auto im = import(*dst, file, trusted);
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 6u) << "the signer's verified claim is accepted";
  EXPECT_EQ(im->rejected, 0u);
  EXPECT_EQ(im->signed_by, to_hex(keys.public_key));
  EXPECT_TRUE(record_verified(decode_record(dst->get(verified_key).value()).value()));

  ImportOptions wrong = opts();
  wrong.trusted_keys = {other.public_key};
  auto w = import(*dst, file, wrong);
  EXPECT_EQ(w.status().code(), Code::kRejected);
  EXPECT_NE(w.status().message().find("not a trusted key"), std::string::npos) << w.status().to_string();

  // An unsigned bundle where keys are required.
  std::string plain = t.path + "/p.kcb";
  ASSERT_TRUE(export_bundle(*src, plain));
  EXPECT_EQ(import(*dst, plain, trusted).status().code(), Code::kRejected);

  // Flipping a flag after signing breaks the signature, trusted keys or not.
  edit_payload(file, [](json& p) { edit_first_record(p, [](Record& r) { r.meta["provenance"]["verified"] = true; }); });
  auto flipped = import(*dst, file, trusted);
  EXPECT_EQ(flipped.status().code(), Code::kRejected);
  EXPECT_NE(flipped.status().message().find("does not verify"), std::string::npos);
  EXPECT_EQ(import(*dst, file).status().code(), Code::kRejected);
}

TEST(BundleKeys, KeyFilesRoundTripAndAreNotOverwritten) {
  TempDir t;
  auto kp = generate_key_pair();
  ASSERT_TRUE(kp);
  ASSERT_TRUE(write_key_pair(t.path + "/keys", "bundle", kp.value()).is_ok());
  EXPECT_EQ(write_key_pair(t.path + "/keys", "bundle", kp.value()).code(), Code::kInvalid);
  EXPECT_EQ(fs::status(t.path + "/keys/bundle.key").permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(read_public_key(t.path + "/keys/bundle.pub").value(), kp->public_key);
  EXPECT_EQ(read_secret_key(t.path + "/keys/bundle.key").value(), kp->secret_key);
  EXPECT_FALSE(read_public_key(t.path + "/keys/bundle.key"));
  auto dir = read_trusted_keys({t.path + "/keys"});
  ASSERT_TRUE(dir);
  EXPECT_EQ(dir->size(), 1u);
  EXPECT_EQ(binary_hash(""), "0e5751c026e543b2e8ab2eb06099daa1d1e5df47778f7787faab45cdf12fe3a8");   // BLAKE2b-256("")
}

// The real compiler: an honest CPU kernel survives the round trip; a source whose build fails
// the binary check is refused even with matching hashes.
TEST(BundleRebuild, HonestCpuKernelRoundTripsThroughTheHostCompiler) {
  TempDir t;
  const std::string target = cpu_backend().target_id();
  if (target.find("nocompiler") != std::string::npos) GTEST_SKIP() << "no host compiler";
  KeyBuilder k(target.c_str(), "aten::relu", "fp32");
  int64_t size = 8, stride = 1;
  k.tensor("self", DType::kF32, &size, &stride, 1, 16);
  const std::string key = k.take();
  json launch = {{"version", 1}, {"launches", json::array({{{"entry", "kc_r"}, {"grid", {1, 1, 1}}, {"block", {1, 1, 1}},
                                                           {"smem", 0}, {"args", json::array({"ptr:out0", "ptr:self"})}}})}};
  const std::string body =
      "extern \"C\" void kc_r(const kc_cpu_ctx*, void* const* a) { float* o = KC_ARG(float*, a, 0); "
      "const float* x = KC_ARG(const float*, a, 1); for (int i = 0; i < 8; ++i) o[i] = x[i] > 0 ? x[i] : 0; }\n";
  auto honest = make_manual_record(key, body, launch, "test");
  ASSERT_TRUE(honest) << honest.status().to_string();
  auto src = writer(t.path + "/src");
  ASSERT_TRUE(src->put(key, encode_record(honest.value())).is_ok());
  std::string file = t.path + "/b.kcb";
  ASSERT_TRUE(export_bundle(*src, file));
  auto dst = writer(t.path + "/dst");
  auto im = import_bundle(*dst, file);
  ASSERT_TRUE(im) << im.status().to_string();
  EXPECT_EQ(im->imported, 1u) << (im->errors.empty() ? "" : im->errors[0]);
  EXPECT_EQ(decode_record(dst->get(key).value())->blob, honest->blob);

  // Same record, but the source now has a constructor (not empty: gcc drops empty ones): hash and
  // binary both honest to the source, and still refused.
  Record ctor = honest.value();
  ctor.source = "__attribute__((constructor(101))) static void kc_c() { __asm__ volatile(\"\"); }\n" + body;
  ctor.blob = cpu_backend().compile(ctor.source).value().binary;
  ASSERT_TRUE(src->put(key, encode_record(ctor)).is_ok());
  ASSERT_TRUE(export_bundle(*src, file));
  auto bad = import_bundle(*dst, file);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->rejected, 1u);
  EXPECT_NE(bad->errors[0].find("runs code at load or unload"), std::string::npos) << bad->errors[0];
}

}  // namespace
}  // namespace kc
