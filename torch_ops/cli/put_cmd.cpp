// `kernelcraft cache put`: compile a kernel for its key's target and store it as a served record.
// Without --verify the record is marked unverified in its provenance, and serving processes leave
// it alone unless serve_unverified is set; with --verify it goes through the same gauntlet as an
// evolved kernel first and is stored only if it passes, with the verdict in its meta.
#include <cstdio>
#include <sstream>

#include "evolve/worker/worker.h"
#include "kernel_cache/key.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/fsutil.h"
#include "runtime/launch_spec.h"
#include "torch_ops/cli/cli.h"

namespace kc::cli {
namespace {

using nlohmann::json;

// The first line of a compiler message that names an error, so a failure fits on one line.
std::string first_error_line(const std::string& msg) {
  std::istringstream in(msg);
  std::string line, first;
  while (std::getline(in, line)) {
    if (first.empty()) first = line;
    if (line.find("error") != std::string::npos && line != first) return first + " " + line;
  }
  return first;
}

}  // namespace

int run_cache_put(const Args& args) {
  if (args.words.size() > 2) return usage_error("cache put: unexpected operand '" + args.words[2] + "'");
  std::string key = args.value("key"), source_path = args.value("source"), launch_path = args.value("launch");
  if (key.empty() || source_path.empty() || launch_path.empty())
    return usage_error("cache put needs --key KEY --source FILE --launch SPEC.json");
  const std::string prefix = "kc" + std::to_string(kKeyVersion) + "|";
  if (key.compare(0, prefix.size(), prefix) != 0 || key_op(key).empty())
    return usage_error("'" + key + "' is not a kernelcraft key (" + prefix + "<target>|<op>|<policy>|...)");
  auto target = parse_target(key_target(key));
  if (!target) return usage_error(target.status().message());

  bool ok = false;
  std::string source = read_file(source_path, &ok);
  if (!ok) return fail("cannot read source file " + source_path);
  std::string spec_text = read_file(launch_path, &ok);
  if (!ok) return fail("cannot read launch spec file " + launch_path);
  json spec_json = json::parse(spec_text, nullptr, /*allow_exceptions=*/false);
  if (spec_json.is_discarded()) return fail(launch_path + " is not valid JSON");
  auto spec = parse_launch_spec(spec_json);
  if (!spec) return fail(launch_path + ": " + spec.status().message());

  // One implementation of "compile for the key's target and build the record" (kernel_cache/manual.h),
  // shared with torch.ops.kernelcraft.put_kernel.
  const bool verify = args.flag("verify");
  auto rec = make_manual_record(key, source, spec_json, verify ? "kernelcraft cache put --verify" : "kernelcraft cache put");
  if (!rec) {
    if (args.json) print_json({{"error", rec.status().to_string()}}, true);
    return fail("compile failed for " + std::string(backend_name(target->kind)) + ": " + first_error_line(rec.status().message()));
  }
  Record& r = rec.value();
  if (verify) {
    json verdict;
    if (int rc = verify_for_put(args, key, source, spec_json, verdict); rc != kExitOk) return rc;   // nothing stored
    r.meta["provenance"]["verified"] = true;
    json& call = verdict["calls"].at(0);
    // The binary the child verified replaces this process's build of the same source.
    auto bin = evolve::verified_binary(call);
    if (!bin) return fail("verify: " + bin.status().message());
    r.blob = std::move(bin.value());
    call.erase("binary");
    // The evidence an evolved record keeps: every stage's outcome and the timings against eager.
    r.meta["verification"] = {{"stages", call.value("stages", json::array())},
                              {"median_ms", call.value("median_ms", 0.0)},
                              {"eager_median_ms", call.value("eager_median_ms", 0.0)},
                              {"copy_gb_s", call.value("copy_gb_s", 0.0)}};
    evolve::record_verdict_facts(r, call);   // determinism and the live check's budget, typed
  }
  if (Status s = put_record(args.cache_dir, r, 10000); !s) return fail(s.message());
  const double compile_ms = r.meta["compile"].value("ms", 0.0);
  if (args.json) {
    print_json({{"key", key}, {"backend", backend_name(r.backend)}, {"blob_bytes", r.blob.size()},
                {"compile_ms", compile_ms}, {"verified", verify}}, true);
  } else {
    std::printf("stored %s (%s, %zu-byte binary, compiled in %.0f ms, %s)\n", key.c_str(), backend_name(r.backend),
                r.blob.size(), compile_ms, verify ? "verified" : "not verified: served only with serve_unverified");
  }
  return kExitOk;
}

}  // namespace kc::cli
