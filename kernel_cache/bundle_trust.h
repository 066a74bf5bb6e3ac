// What makes a bundle trustworthy: binary hashes (BLAKE2b-256) and ed25519 signatures, both from
// libsodium; and the key files `kernelcraft keygen` writes. No crypto is written here by hand.
//
// Key files are one line of text, hex encoded:
//   <name>.pub   "kernelcraft-ed25519-public <64 hex digits>\n"    (share it with importers)
//   <name>.key   "kernelcraft-ed25519-secret <128 hex digits>\n"   (mode 0600; signs bundles)
// A signature covers the bytes kSignatureContext followed by the bundle's payload (bundle.h).
#pragma once
#include <string>
#include <vector>

#include "runtime/status.h"

namespace kc {

constexpr const char* kSignatureContext = "kernelcraft-bundle-signature-v2";

// Hex BLAKE2b-256 of `bytes` (64 digits).
std::string binary_hash(const std::string& bytes);

struct KeyPair {
  std::string public_key;   // 32 raw bytes
  std::string secret_key;   // 64 raw bytes (libsodium's seed + public key form)
};

// A fresh key pair from the system's random source.
Result<KeyPair> generate_key_pair();
// Writes <dir>/<name>.pub and <dir>/<name>.key (0600, never overwritten: kInvalid if present).
Status write_key_pair(const std::string& dir, const std::string& name, const KeyPair& kp);
// Reads a .pub or .key file; kInvalid if it is not one.
Result<std::string> read_public_key(const std::string& path);
Result<std::string> read_secret_key(const std::string& path);
// The public keys in `paths`: each a .pub file, or a directory whose *.pub files are read.
Result<std::vector<std::string>> read_trusted_keys(const std::vector<std::string>& paths);

// The detached signature (64 bytes) of kSignatureContext + payload.
std::string sign_payload(const std::string& payload, const std::string& secret_key);
// True when `signature` is `public_key`'s signature of kSignatureContext + payload.
bool signature_valid(const std::string& payload, const std::string& signature, const std::string& public_key);

// Hex of a raw key (for messages and provenance).
std::string to_hex(const std::string& raw);

// Standard base64 (libsodium's), for binaries inside JSON messages; kInvalid for bad text.
std::string to_base64(const std::string& raw);
Result<std::string> from_base64(const std::string& text);

}  // namespace kc
