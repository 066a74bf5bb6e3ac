// Bundles: a cache (or part of it) in one file, for shipping pre-warmed kernels to deployments.
//
// A bundle is a trust boundary: importing trusts the compiler on this machine and the source in
// the bundle, never a bundle's binary or its "verified" flag on their own. Every record with a
// binary is rebuilt here from its source (compile_for_target, manual.h) and accepted only if the
// rebuild's BLAKE2b-256 equals the hash the exporter wrote (so the stored source is the one the
// binary came from, and `cache show` tells the truth); CPU rebuilds must also pass the binary
// check (runtime/binary_check.h). A record that claims to be verified keeps that claim only if the
// bundle is signed by a key the importer trusts; otherwise it needs the gauntlet here
// (ImportChecks::reverify, `cache import --reverify`) or it is refused.
//
// Bundle format (version 2): one CBOR map, written to a temporary file and renamed into place.
//   magic      string  "kernelcraft-bundle"
//   version    int     kBundleVersion
//   payload    bytes   CBOR of the map below; these exact bytes are what a signature covers
//     created  int     unix time of the export
//     count    int     number of entries
//     records  array   of {"key": string,
//                          "record": bytes (an encoded record, record.h, with an empty blob),
//                          "binary": {"bytes": int, "blake2b": 64 hex digits} or null (no blob)}
//   signature  map     optional: {"alg": "ed25519", "public_key": bytes(32), "sig": bytes(64)},
//                      the signature of kSignatureContext + payload (bundle_trust.h)
// Version 1 (entries {"key", "value": encoded record with its blob}, no payload, never signed) is
// still read: the carried blob is used for its hash only, exactly like a version 2 entry.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/status.h"

namespace kc {

constexpr int kBundleVersion = 2;

// Which records to export; empty fields match everything.
struct BundleFilter {
  std::string key_contains;  // substring of the key
  std::string op;            // aten name ("aten::gelu") or short name ("gelu")
};

struct ExportStats {
  size_t exported = 0;
  size_t skipped = 0;                // stored values that do not decode (left out, listed)
  size_t damaged = 0;                // damaged regions of the database skipped (their keys are lost)
  size_t bytes = 0;                  // size of the bundle file
  std::vector<std::string> errors;   // "<key>: <why>" per skipped value
};

// Writes every matching record of `store` (any mode) to `path` atomically; signed with
// `secret_key` (64 raw bytes, bundle_trust.h) unless it is empty.
Result<ExportStats> export_bundle(Store& store, const std::string& path, const BundleFilter& filter = {},
                                  const std::string& secret_key = "");

// What import asks of the machine it runs on. Empty members take the defaults.
struct ImportChecks {
  // The binary for r.key's target built here from r.source. Default: compile_for_target
  // (manual.h), and for CPU targets check_cpu_binary (runtime/binary_check.h) on the result.
  std::function<Result<std::string>(const Record& r)> rebuild;
  // The full gauntlet for r (r.blob is the local build): the verdict JSON to keep in
  // meta.verification when verified, an error status (its message one line) when not.
  // Set only for --reverify; then every served record is verified here and hashes need not match.
  std::function<Result<nlohmann::json>(const Record& r)> reverify;
};

struct ImportOptions {
  bool overwrite = true;    // replace records already stored under the same key
  bool dry_run = false;     // validate and count only
  // Raw ed25519 public keys. Non-empty: the bundle must be signed by one of them (else the whole
  // import is kRejected). Empty: no signature is trusted, so no "verified" claim is either.
  std::vector<std::string> trusted_keys;
  // Non-empty: the bundle came from this peer of the user's own distributed job, through the job's
  // store (dispatcher/coordinator.h), which the job trusts as it trusts its rendezvous. Its
  // "verified" claims are kept without a signature. Either way a claim kept on another's word
  // (this peer's or a trusted signer's) is marked meta.provenance.verified_here = false, with
  // vouched_by, so the serving path live-checks the kernel on its first calls here.
  std::string job_peer;
  ImportChecks checks;
};

struct ImportStats {
  size_t imported = 0;
  size_t unchanged = 0;              // identical bytes already stored
  size_t kept = 0;                   // a different record stored and overwrite == false
  size_t rejected = 0;               // entries refused: undecodable, wrong key, rebuild differs,
                                     // binary check failed, unbacked "verified" claim, reverify failed
  size_t reverified = 0;             // entries the gauntlet passed here (--reverify)
  std::string signed_by;             // hex public key of a trusted signer, "" if none
  std::vector<std::string> errors;   // "<key>: <why>" per rejected entry
};

// Reads `path` and stores its accepted records (store must be a kWriter unless dry_run). A file
// that is not a bundle is kCorrupt; another bundle version kUnsupported; a bad or untrusted
// signature kRejected; bad entries are counted, not fatal.
Result<ImportStats> import_bundle(Store& store, const std::string& path, const ImportOptions& opts = {});
// The same for a bundle already in memory; `from` names its origin in messages.
Result<ImportStats> import_bundle_bytes(Store& store, const std::string& bytes, const std::string& from,
                                        const ImportOptions& opts = {});

// An unsigned bundle of `records` (each exported as export_bundle would: binary hash, no binary),
// in memory: what the job store carries from the node that searched a key to the others.
Result<std::string> bundle_of(const std::vector<Record>& records);

}  // namespace kc
