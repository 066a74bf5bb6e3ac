// Canonical cache keys: appends fields in the schema of key.h without allocating per field.
#include "kernel_cache/key.h"

#include <cctype>
#include <charconv>

namespace kc {
namespace {

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

void append_ints(std::string& out, const int64_t* v, size_t n) {
  out.push_back('[');
  for (size_t k = 0; k < n; ++k) {
    if (k) out.push_back(',');
    append_int(out, v[k]);
  }
  out.push_back(']');
}

void append_tensor_body(std::string& out, DType dt, const int64_t* sizes, size_t nsizes,
                        const int64_t* strides, size_t nstrides, int align) {
  out.append(dtype_name(dt));
  append_ints(out, sizes, nsizes);
  out.push_back('s');
  append_ints(out, strides, nstrides);
  out.push_back('a');
  append_int(out, align);
}

// Returns field `index` of a '|'-separated key, or "" if the key is not a kc<version> key or has
// too few fields (target, op and policy are always present in a well-formed key).
std::string field(const std::string& key, int index) {
  if (key.size() < 3 || key.compare(0, 2, "kc") != 0) return "";
  size_t start = 0;
  for (int f = 0; f < index; ++f) {
    size_t bar = key.find('|', start);
    if (bar == std::string::npos) return "";
    start = bar + 1;
  }
  size_t end = key.find('|', start);
  // A key always has a policy field after the op, so the op and target are never the last field.
  if (end == std::string::npos) return "";
  return key.substr(start, end - start);
}

}  // namespace

KeyBuilder::KeyBuilder(const std::string& target, const char* op, const char* policy) {
  // Typical keys are 80-200 characters; one reservation avoids regrowth on the hot path.
  key_.reserve(192);
  key_.append("kc");
  append_int(key_, kKeyVersion);
  key_.push_back('|');
  key_.append(target);
  key_.push_back('|');
  key_.append(op);
  key_.push_back('|');
  key_.append(policy);
}

void KeyBuilder::head(const char* name, const char* kind) {
  key_.push_back('|');
  key_.append(name);
  key_.push_back('=');
  key_.append(kind);
}

void KeyBuilder::tensor(const char* name, DType dt, const int64_t* sizes, const int64_t* strides,
                        size_t ndim, int align) {
  head(name, "T:");
  append_tensor_body(key_, dt, sizes, ndim, strides, ndim, align);
}

void KeyBuilder::tensor(const char* name, const TensorMeta& t) {
  if (!t.defined) {
    absent(name);
    return;
  }
  // Sizes and strides are written with their own lengths, so a malformed TensorMeta (ranks differ)
  // still gives a key that is never confused with a valid one and never reads out of bounds.
  head(name, "T:");
  append_tensor_body(key_, t.dtype, t.sizes.data(), t.sizes.size(), t.strides.data(),
                     t.strides.size(), t.align);
}

void KeyBuilder::absent(const char* name) {
  head(name, "none");
}

void KeyBuilder::i(const char* name, int64_t v) {
  head(name, "i:");
  append_int(key_, v);
}

void KeyBuilder::d(const char* name, double v) {
  head(name, "d:");
  // general format with 17 significant digits is exactly printf's %.17g: every double round-trips.
  char buf[40];
  auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, 17);
  key_.append(buf, r.ptr);
}

void KeyBuilder::b(const char* name, bool v) {
  head(name, "b:");
  key_.push_back(v ? '1' : '0');
}

void KeyBuilder::s(const char* name, const std::string& v) {
  head(name, "s:");
  key_.append(v);
}

void KeyBuilder::list(const char* name, const int64_t* v, size_t n) {
  head(name, "L:");
  append_ints(key_, v, n);
}

std::string key_op(const std::string& key) { return field(key, 2); }

std::string key_target(const std::string& key) { return field(key, 1); }
std::string search_state_key(const std::string& key) { return "search|" + key; }

Result<TargetInfo> parse_target(const std::string& target) {
  if (target.rfind("cpu-", 0) == 0 && target.size() > 4) return TargetInfo{BackendKind::kCpu, 0};
  const std::string cuda = "cuda-sm_";
  if (target.rfind(cuda, 0) == 0) {
    size_t i = cuda.size();
    int sm = 0;
    while (i < target.size() && std::isdigit(static_cast<unsigned char>(target[i])) && sm < 10000)
      sm = sm * 10 + (target[i++] - '0');
    if (i > cuda.size() && sm > 0) return TargetInfo{BackendKind::kCuda, sm};
  }
  return Status::error(Code::kInvalid, "key target '" + target + "' is neither cpu-... nor cuda-sm_XX...");
}

}  // namespace kc
