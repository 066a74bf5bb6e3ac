// Hashes, signatures and key files for bundles (bundle_trust.h), through libsodium.
#include "kernel_cache/bundle_trust.h"

#include <fcntl.h>
#include <sodium.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/fsutil.h"

namespace kc {
namespace {

const char* kPublicTag = "kernelcraft-ed25519-public ";
const char* kSecretTag = "kernelcraft-ed25519-secret ";

bool sodium_ready() {
  static const int rc = sodium_init();   // 0 the first time, 1 if already initialised; thread-safe
  return rc >= 0;
}

std::string with_context(const std::string& payload) {
  std::string m = kSignatureContext;
  m.push_back('\0');
  return m + payload;
}

Result<std::string> from_hex(const std::string& hex, size_t bytes) {
  std::string out(bytes, '\0');
  size_t got = 0;
  if (hex.size() != 2 * bytes ||
      sodium_hex2bin(reinterpret_cast<unsigned char*>(&out[0]), bytes, hex.data(), hex.size(), nullptr, &got, nullptr) != 0 ||
      got != bytes)
    return Status::error(Code::kInvalid, "bad hex key");
  return out;
}

Result<std::string> read_key(const std::string& path, const char* tag, size_t bytes) {
  bool ok = false;
  std::string text = read_file(path, &ok);
  if (!ok) return Status::error(Code::kNotFound, "cannot read key file " + path);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  const size_t n = std::strlen(tag);
  if (text.compare(0, n, tag) != 0)
    return Status::error(Code::kInvalid, path + " is not a kernelcraft " + (bytes == 32 ? "public" : "secret") + " key");
  auto raw = from_hex(text.substr(n), bytes);
  if (!raw) return Status::error(Code::kInvalid, path + ": " + raw.status().message());
  return raw;
}

Status write_new(const std::string& path, const std::string& text, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0)
    return Status::error(errno == EEXIST ? Code::kInvalid : Code::kIOError,
                         "cannot create " + path + ": " + std::strerror(errno));
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::fsync(fd) == 0 && ok;
  ok = ::close(fd) == 0 && ok;
  return ok ? Status::ok() : Status::error(Code::kIOError, "cannot write " + path);
}

}  // namespace

std::string to_hex(const std::string& raw) {
  std::string hex(raw.size() * 2 + 1, '\0');
  sodium_bin2hex(&hex[0], hex.size(), reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
  hex.pop_back();
  return hex;
}

std::string to_base64(const std::string& raw) {
  constexpr int kVariant = sodium_base64_VARIANT_ORIGINAL;
  std::string out(sodium_base64_ENCODED_LEN(raw.size(), kVariant), '\0');
  sodium_bin2base64(&out[0], out.size(), reinterpret_cast<const unsigned char*>(raw.data()), raw.size(), kVariant);
  out.resize(std::strlen(out.c_str()));
  return out;
}

Result<std::string> from_base64(const std::string& text) {
  std::string out(text.size() / 4 * 3 + 3, '\0');
  size_t got = 0;
  if (sodium_base642bin(reinterpret_cast<unsigned char*>(&out[0]), out.size(), text.data(), text.size(), nullptr,
                        &got, nullptr, sodium_base64_VARIANT_ORIGINAL) != 0)
    return Status::error(Code::kInvalid, "not base64");
  out.resize(got);
  return out;
}

std::string binary_hash(const std::string& bytes) {
  sodium_ready();   // BLAKE2b needs no initialisation, but sodium_init picks the fastest code
  unsigned char h[32];
  crypto_generichash(h, sizeof h, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), nullptr, 0);
  return to_hex(std::string(reinterpret_cast<const char*>(h), sizeof h));
}

Result<KeyPair> generate_key_pair() {
  if (!sodium_ready()) return Status::error(Code::kUnavailable, "libsodium did not initialise");
  KeyPair kp;
  kp.public_key.resize(crypto_sign_PUBLICKEYBYTES);
  kp.secret_key.resize(crypto_sign_SECRETKEYBYTES);
  crypto_sign_keypair(reinterpret_cast<unsigned char*>(&kp.public_key[0]), reinterpret_cast<unsigned char*>(&kp.secret_key[0]));
  return kp;
}

Status write_key_pair(const std::string& dir, const std::string& name, const KeyPair& kp) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string pub = dir + "/" + name + ".pub", sec = dir + "/" + name + ".key";
  if (std::filesystem::exists(pub, ec) || std::filesystem::exists(sec, ec))
    return Status::error(Code::kInvalid, "a key named '" + name + "' already exists in " + dir);
  KC_RETURN_IF_ERROR(write_new(sec, kSecretTag + to_hex(kp.secret_key) + "\n", 0600));
  return write_new(pub, kPublicTag + to_hex(kp.public_key) + "\n", 0644);
}

Result<std::string> read_public_key(const std::string& path) { return read_key(path, kPublicTag, crypto_sign_PUBLICKEYBYTES); }
Result<std::string> read_secret_key(const std::string& path) { return read_key(path, kSecretTag, crypto_sign_SECRETKEYBYTES); }

Result<std::vector<std::string>> read_trusted_keys(const std::vector<std::string>& paths) {
  std::vector<std::string> keys;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      for (std::filesystem::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().extension() != ".pub") continue;
        auto k = read_public_key(it->path().string());
        if (!k) return k.status();
        keys.push_back(k.value());
      }
      continue;
    }
    auto k = read_public_key(p);
    if (!k) return k.status();
    keys.push_back(k.value());
  }
  if (keys.empty()) return Status::error(Code::kNotFound, "no public keys (*.pub) in the trusted key paths");
  return keys;
}

std::string sign_payload(const std::string& payload, const std::string& secret_key) {
  if (!sodium_ready() || secret_key.size() != crypto_sign_SECRETKEYBYTES) return "";
  const std::string m = with_context(payload);
  std::string sig(crypto_sign_BYTES, '\0');
  crypto_sign_detached(reinterpret_cast<unsigned char*>(&sig[0]), nullptr, reinterpret_cast<const unsigned char*>(m.data()),
                       m.size(), reinterpret_cast<const unsigned char*>(secret_key.data()));
  return sig;
}

bool signature_valid(const std::string& payload, const std::string& signature, const std::string& public_key) {
  if (!sodium_ready() || signature.size() != crypto_sign_BYTES || public_key.size() != crypto_sign_PUBLICKEYBYTES)
    return false;
  const std::string m = with_context(payload);
  return crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(signature.data()),
                                     reinterpret_cast<const unsigned char*>(m.data()), m.size(),
                                     reinterpret_cast<const unsigned char*>(public_key.data())) == 0;
}

}  // namespace kc
