// Cache records: exact round trips, and damaged or foreign bytes rejected with the right code.
#include <gtest/gtest.h>

#include "kernel_cache/record.h"

namespace kc {
namespace {

using nlohmann::json;

Record sample() {
  Record r;
  r.key = "kc1|cpu-x86_64+gcc-12.2.0|aten::relu|fp32|self=T:f32[16]s[1]a16";
  r.op = "aten::relu";
  r.backend = BackendKind::kCpu;
  r.state = RecordState::kServed;
  r.source = "extern \"C\" void kc_relu(const kc_cpu_ctx* c, void* const* a) {}\n";
  r.launch = {{"version", 1}, {"launches", json::array({{{"entry", "kc_relu"}}})}};
  r.meta = {{"provenance", {{"by", "test"}, {"verified", false}}}, {"speedup", 1.25}};
  // Binary with NULs and high bytes: the blob is a shared object, not text.
  r.blob = std::string("\x7f" "ELF\0\0\x01\xff\xfe", 9) + std::string(1000, '\0');
  return r;
}

json encoded_json(const Record& r) { return json::from_cbor(encode_record(r)); }

Status decode_json(const json& j) {
  std::string bytes;
  json::to_cbor(j, bytes);
  return decode_record(bytes).status();
}

TEST(Record, RoundTrip) {
  Record r = sample();
  auto back = decode_record(encode_record(r));
  ASSERT_TRUE(back) << back.status().to_string();
  EXPECT_EQ(back->format, kRecordFormat);
  EXPECT_EQ(back->key, r.key);
  EXPECT_EQ(back->op, r.op);
  EXPECT_EQ(back->backend, r.backend);
  EXPECT_EQ(back->state, r.state);
  EXPECT_EQ(back->source, r.source);
  EXPECT_EQ(back->launch, r.launch);
  EXPECT_EQ(back->meta, r.meta);
  EXPECT_EQ(back->blob, r.blob);
  EXPECT_EQ(encode_record(back.value()), encode_record(r)) << "encoding must be deterministic";
}

TEST(Record, EagerBestWithEmptyBlob) {
  Record r = sample();
  r.state = RecordState::kEagerBest;
  r.blob.clear();
  r.source.clear();
  auto back = decode_record(encode_record(r));
  ASSERT_TRUE(back) << back.status().to_string();
  EXPECT_EQ(back->state, RecordState::kEagerBest);
  EXPECT_TRUE(back->blob.empty());
}

TEST(Record, BlobIsStoredAsCborBytes) {
  json j = encoded_json(sample());
  ASSERT_TRUE(j.contains("blob"));
  EXPECT_TRUE(j["blob"].is_binary());
  EXPECT_EQ(j["format"], kRecordFormat);
}

TEST(Record, BackendIsANameOnDiskAndAnUnknownOneIsCorrupt) {
  Record r = sample();
  r.backend = BackendKind::kCuda;
  json j = encoded_json(r);
  EXPECT_EQ(j["backend"], "cuda");
  EXPECT_EQ(decode_record(encode_record(r)).value().backend, BackendKind::kCuda);
  j["backend"] = "hip";
  EXPECT_EQ(decode_json(j).code(), Code::kCorrupt);
}

TEST(Record, GarbageIsCorrupt) {
  EXPECT_EQ(decode_record("").status().code(), Code::kCorrupt);
  EXPECT_EQ(decode_record("not cbor at all").status().code(), Code::kCorrupt);
  EXPECT_EQ(decode_record(std::string("\xff\xff\xff", 3)).status().code(), Code::kCorrupt);
  std::string bytes = encode_record(sample());
  // Torn writes: every truncation must be rejected, never crash.
  for (size_t n : {size_t(1), size_t(10), bytes.size() / 2, bytes.size() - 1}) {
    auto s = decode_record(bytes.substr(0, n)).status();
    EXPECT_EQ(s.code(), Code::kCorrupt) << n << " bytes: " << s.to_string();
  }
  // Trailing garbage after a valid map.
  EXPECT_EQ(decode_record(bytes + "x").status().code(), Code::kCorrupt);
  // A valid CBOR value that is not a map.
  EXPECT_EQ(decode_json(json::array({1, 2})).code(), Code::kCorrupt);
}

TEST(Record, FlippedBytesNeverCrash) {
  std::string bytes = encode_record(sample());
  for (size_t i = 0; i < bytes.size(); i += 7) {
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x5a);
    auto r = decode_record(b);   // any outcome but a crash or exception; usually kCorrupt
    if (!r) {
      EXPECT_TRUE(r.status().code() == Code::kCorrupt || r.status().code() == Code::kUnsupported)
          << r.status().to_string();
    }
  }
}

TEST(Record, MissingOrMistypedFieldsAreCorrupt) {
  json good = encoded_json(sample());
  ASSERT_TRUE(decode_json(good).is_ok());
  for (const char* f : {"format", "key", "op", "backend", "state", "source", "launch", "meta", "blob"}) {
    json j = good;
    j.erase(f);
    Status s = decode_json(j);
    EXPECT_EQ(s.code(), Code::kCorrupt) << "without " << f;
    EXPECT_NE(s.message().find(f), std::string::npos) << s.message();
  }
  auto with = [&](const char* f, json v) {
    json j = good;
    j[f] = std::move(v);
    return decode_json(j).code();
  };
  EXPECT_EQ(with("format", "1"), Code::kCorrupt);
  EXPECT_EQ(with("key", 5), Code::kCorrupt);
  EXPECT_EQ(with("key", ""), Code::kCorrupt);
  EXPECT_EQ(with("launch", json::array()), Code::kCorrupt);
  EXPECT_EQ(with("meta", "x"), Code::kCorrupt);
  EXPECT_EQ(with("blob", "text, not bytes"), Code::kCorrupt);
  EXPECT_EQ(with("state", "maybe"), Code::kCorrupt);
  EXPECT_EQ(with("state", "disabled"), Code::kOk);
}

TEST(Record, OtherFormatIsUnsupported) {
  json j = encoded_json(sample());
  j["format"] = kRecordFormat + 1;
  EXPECT_EQ(decode_json(j).code(), Code::kUnsupported);
  // Another format may not have our fields at all; the version decides first.
  EXPECT_EQ(decode_json(json{{"format", 0}}).code(), Code::kUnsupported);
}

TEST(Record, SummaryReplacesBlob) {
  Record r = sample();
  json s = record_summary(r);
  EXPECT_EQ(s["key"], r.key);
  EXPECT_EQ(s["source"], r.source);
  EXPECT_EQ(s["blob"]["bytes"], r.blob.size());
  std::string h = s["blob"]["fnv1a64"];
  EXPECT_EQ(h.size(), 16u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
  // FNV-1a of "" and of "a" are fixed by the algorithm.
  r.blob.clear();
  EXPECT_EQ(record_summary(r)["blob"]["fnv1a64"], "cbf29ce484222325");
  r.blob = "a";
  EXPECT_EQ(record_summary(r)["blob"]["fnv1a64"], "af63dc4c8601ec8c");
  EXPECT_NO_THROW(s.dump());
}

}  // namespace
}  // namespace kc

namespace kc {
namespace {

// States are an enum inside; their names exist only in the encoded record and the CLI's output.
TEST(Record, StateNamesRoundTrip) {
  for (RecordState s : {RecordState::kServed, RecordState::kEagerBest, RecordState::kDisabled})
    EXPECT_EQ(state_from(state_name(s)), s) << state_name(s);
  EXPECT_FALSE(state_from("unverified").has_value());
  EXPECT_FALSE(state_from("").has_value());
}

}  // namespace
}  // namespace kc
