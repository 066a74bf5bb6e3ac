// `kernelcraft cache put`: compile a kernel for its key's target and store it as a served record.
// The record is marked unverified in its provenance: put is for hand-written and shipped kernels,
// the gauntlet (evolve/) is what verifies.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kernel_cache/key.h"
#include "kernel_cache/manual.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/launch_spec.h"
#include "torch_ops/cli/cli.h"

namespace kc::cli {
namespace {

using nlohmann::json;

Result<std::string> read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::error(Code::kNotFound, std::string("cannot read ") + what + " file " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

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

struct Target {
  std::string backend;   // "cpu" | "cuda"
  int sm = 0;            // cuda: the architecture, e.g. 90
};

// "cpu-..." or "cuda-sm_XX..." (kernel_cache/key.h); anything else cannot be compiled here.
Result<Target> parse_target(const std::string& target) {
  if (target.compare(0, 3, "cpu") == 0) return Target{"cpu", 0};
  const std::string cuda = "cuda-sm_";
  if (target.compare(0, cuda.size(), cuda) == 0) {
    size_t i = cuda.size();
    int sm = 0;
    while (i < target.size() && std::isdigit(static_cast<unsigned char>(target[i])) && sm < 10000)
      sm = sm * 10 + (target[i++] - '0');
    if (i > cuda.size() && sm > 0) return Target{"cuda", sm};
  }
  return Status::error(Code::kInvalid, "key target '" + target + "' is neither cpu-... nor cuda-sm_XX...");
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

  auto source = read_text(source_path, "source");
  if (!source) return fail(source.status().message());
  auto spec_text = read_text(launch_path, "launch spec");
  if (!spec_text) return fail(spec_text.status().message());
  json spec_json = json::parse(spec_text.value(), nullptr, /*allow_exceptions=*/false);
  if (spec_json.is_discarded()) return fail(launch_path + " is not valid JSON");
  auto spec = parse_launch_spec(spec_json);
  if (!spec) return fail(launch_path + ": " + spec.status().message());

  // One implementation of "compile for the key's target and build the record" (kernel_cache/manual.h),
  // shared with torch.ops.kernelcraft.put_kernel.
  auto rec = make_manual_record(key, source.value(), spec_json, "kernelcraft cache put");
  if (!rec) {
    if (args.json) print_json({{"error", rec.status().to_string()}}, true);
    return fail("compile failed for " + target->backend + ": " + first_error_line(rec.status().message()));
  }
  const Record& r = rec.value();
  if (Status s = put_record(args.cache_dir, r, 10000); !s) return fail(s.message());
  const double compile_ms = r.meta["compile"].value("ms", 0.0);
  if (args.json) {
    print_json({{"key", key}, {"backend", r.backend}, {"blob_bytes", r.blob.size()},
                {"compile_ms", compile_ms}}, true);
  } else {
    std::printf("stored %s (%s, %zu-byte binary, compiled in %.0f ms)\n", key.c_str(), r.backend.c_str(),
                r.blob.size(), compile_ms);
  }
  return kExitOk;
}

}  // namespace kc::cli
