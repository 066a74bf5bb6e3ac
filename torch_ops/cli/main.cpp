// kernelcraft: the command-line tool for the kernel cache (ls, show, rm, export, import, stats, put)
// and the operator table. A hand-written argv parser keeps it free of dependencies.
#include <cstdio>
#include <set>
#include <string>

#include "evolve/worker/child.h"
#include "kernel_cache/store.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/ops.h"
#include "runtime/temp_files.h"
#include "torch_ops/cli/cli.h"

namespace kc::cli {
namespace {

const char kUsage[] =
    "usage: kernelcraft [--cache-dir DIR] [--json] COMMAND ...\n"
    "\n"
    "  ops                                  the operators kernelcraft can intercept\n"
    "  targets                              this machine's key targets (cpu; cuda if usable)\n"
    "  cache ls [--op OP] [--match TEXT]    records: state (\"unverified\" if never verified),\n"
    "                                       backend, binary size, key\n"
    "  cache show KEY                       one record (the binary summarised by size and hash)\n"
    "  cache rm KEY                         delete one record\n"
    "  cache stats                          counts by state, backend and op; sizes\n"
    "  cache export FILE [--op OP] [--match TEXT] [--sign SECRET.key]\n"
    "                                       write matching records (source, launch spec and a\n"
    "                                       hash of each binary) to a bundle file, signed if asked\n"
    "  cache import FILE [--no-overwrite] [--trust PUB|DIR]... [--reverify] [--device N]\n"
    "                                       rebuild each record here and store it if the build\n"
    "                                       matches the bundle's hash; a \"verified\" claim needs a\n"
    "                                       signature by a --trust key (or trusted_keys), or\n"
    "                                       --reverify (the full gauntlet here)\n"
    "  keygen --out DIR                     a bundle-signing key pair: DIR/bundle-signing.key\n"
    "                                       (for --sign) and DIR/bundle-signing.pub (for --trust)\n"
    "  cache repair                         salvage a damaged cache (RocksDB's repair; the old\n"
    "                                       files are kept in repair-backup-*; counts reported)\n"
    "  cache put --key KEY --source FILE --launch SPEC.json [--verify] [--device N]\n"
    "                                       compile FILE for KEY's target (cpu-..., or\n"
    "                                       cuda-sm_XX... with NVRTC) and store it as served;\n"
    "                                       --verify: only if it passes the gauntlet (otherwise\n"
    "                                       it is served only with serve_unverified)\n"
    "\n"
    "  evolve (--keys FILE | --key KEY | --op OP --shape AxB[;CxD]) [--device N] [--backend cuda|cpu]\n"
    "         [--dtype f32] [--args JSON] [--mu N] [--lambda N] [--generations N] [--budget-s S]\n"
    "                                       search kernels offline for keys (e.g. a miss log)\n"
    "                                       and store the winners (or eager_best)\n"
    "  verify (--key KEY | --op OP --shape AxB[;CxD]) --source FILE --launch SPEC.json\n"
    "         [--backend cuda|cpu] [--dtype f32] [--args JSON] [--device N] [--precision P]\n"
    "                                       run a kernel through the whole verification\n"
    "                                       gauntlet; exit 0 only if it is verified\n"
    "  search-state KEY                     every candidate a key's search tried, with verdicts\n"
    "  report [--out FILE.html]             the cache as one self-contained HTML page (no server or\n"
    "                                       network): per key its state, speedup, bandwidth, search\n"
    "                                       curve, gauntlet evidence and lineage; per operator and\n"
    "                                       cache the totals and where the time went. Default: stdout;\n"
    "                                       --json prints the same data as JSON instead\n"
    "  worker [--settings JSON] [--idle-s S] the evolution worker (started by the runtime)\n"
    "  job-check FILE...                    validate job files as the worker does (one JSON line each)\n"
    "\n"
    "  --cache-dir DIR   cache directory (default: $KERNELCRAFT_CACHE_DIR, else\n"
    "                    $XDG_CACHE_HOME/kernelcraft, else ~/.cache/kernelcraft)\n"
    "  --json            machine-readable output on stdout\n"
    "OP is a short name (gelu) or an aten name (aten::gelu). Exit status: 0 ok, 1 failure, 2 usage.\n";

const std::set<std::string> kValueOptions = {"cache-dir", "op", "match", "key", "source", "launch", "keys",
                                             "shape", "dtype", "args", "backend", "device", "precision",
                                             "mu", "lambda", "generations", "budget-s", "gpu-share", "jobs",
                                             "idle-s", "sign", "trust", "out", "settings"};
const std::set<std::string> kSwitches = {"json", "help", "no-overwrite", "verify", "reverify"};

// Fills `out` from argv; returns kExitOk or a usage error (already printed).
int parse(int argc, char** argv, Args& out) {
  bool operands_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (operands_only || a.size() < 2 || a[0] != '-') {
      out.words.push_back(a);
      continue;
    }
    if (a == "--") {
      operands_only = true;
      continue;
    }
    if (a == "-h") a = "--help";
    if (a.compare(0, 2, "--") != 0) return usage_error("unknown option '" + a + "'");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (kSwitches.count(name)) {
      if (inline_value) return usage_error("option --" + name + " takes no value");
      out.flags[name] = true;
      continue;
    }
    if (!kValueOptions.count(name)) return usage_error("unknown option '--" + name + "'");
    if (!inline_value) {
      if (i + 1 >= argc) return usage_error("option --" + name + " needs a value");
      value = argv[++i];
    }
    if (value.empty()) return usage_error("option --" + name + " needs a non-empty value");
    if ((name == "shape" || name == "trust") && out.values.count(name)) {   // repeatable: they accumulate
      out.values[name] += ";" + value;
      continue;
    }
    if (out.values.count(name)) return usage_error("option --" + name + " given twice");
    out.values[name] = value;
  }
  out.json = out.flag("json");
  out.cache_dir = out.value("cache-dir");
  if (out.cache_dir.empty()) out.cache_dir = default_cache_dir();
  return kExitOk;
}

// The target field keys get on this machine, so `cache put --key` can be written by hand.
int run_targets(const Args& args) {
  if (args.words.size() > 1) return usage_error("targets takes no operands");
  nlohmann::json list = nlohmann::json::array();
  auto add = [&](BackendKind k, int d) {
    if (auto b = backend_for(k, d)) list.push_back({{"backend", backend_name(k)}, {"device", d}, {"target", b.value()->target_id()}});
  };
  add(BackendKind::kCpu, 0);
  for (int d = 0; d < 64 && cuda_available(d).is_ok(); ++d) add(BackendKind::kCuda, d);
  if (args.json) {
    print_json(list, true);
    return kExitOk;
  }
  for (const auto& t : list)
    std::printf("%-5s %d  %s\n", t["backend"].get<std::string>().c_str(), t["device"].get<int>(),
                t["target"].get<std::string>().c_str());
  return kExitOk;
}

int run_ops(const Args& args) {
  if (args.words.size() > 1) return usage_error("ops takes no operands");
  if (args.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& o : all_ops())
      list.push_back({{"name", o.name}, {"aten", o.aten}, {"family", family_name(o.family)},
                      {"default", o.default_on}});
    print_json(list, true);
    return kExitOk;
  }
  std::printf("%-22s %-36s %-20s %s\n", "NAME", "ATEN", "FAMILY", "DEFAULT");
  for (const auto& o : all_ops())
    std::printf("%-22s %-36s %-20s %s\n", o.name, o.aten, family_name(o.family), o.default_on ? "yes" : "no");
  return kExitOk;
}

// Options a command does not use are mistakes worth reporting (a typo'd --op would otherwise
// silently export everything).
int check_options(const Args& args) {
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"ops", {}},
      {"targets", {}},
      {"ls", {"op", "match"}},
      {"show", {}},
      {"rm", {}},
      {"stats", {}},
      {"export", {"op", "match", "sign"}},
      {"import", {"no-overwrite", "trust", "reverify", "device"}},
      {"keygen", {"out"}},
      {"repair", {}},
      {"put", {"key", "source", "launch", "verify", "device"}},
      {"worker", {"jobs", "idle-s", "gpu-share", "settings"}},
      {"search-state", {}},
      {"report", {"out"}},
      {"job-check", {}},
      {"evolve", {"keys", "key", "op", "shape", "dtype", "args", "backend", "device", "precision", "mu", "lambda",
                  "generations", "budget-s", "gpu-share"}},
      {"verify", {"key", "op", "shape", "dtype", "args", "backend", "device", "precision", "source", "launch"}},
  };
  std::string cmd = args.words[0] == "cache" && args.words.size() > 1 ? args.words[1] : args.words[0];
  auto it = allowed.find(cmd);
  if (it == allowed.end()) return kExitOk;   // the unknown command is reported by the dispatcher
  for (const auto& [name, v] : args.values)
    if (name != "cache-dir" && !it->second.count(name)) return usage_error("option --" + name + " does not apply to " + cmd);
  for (const auto& [name, v] : args.flags)
    if (name != "json" && name != "help" && !it->second.count(name))
      return usage_error("option --" + name + " does not apply to " + cmd);
  return kExitOk;
}

int run(int argc, char** argv) {
  Args args;
  if (int rc = parse(argc, argv, args); rc != kExitOk) return rc;
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.words.empty()) return usage_error("no command given (kernelcraft --help lists them)");
  if (int rc = check_options(args); rc != kExitOk) return rc;
  const std::string& cmd = args.words[0];
  if (cmd == "ops") return run_ops(args);
  if (cmd == "targets") return run_targets(args);
  if (cmd == "cache") return run_cache(args);
  if (cmd == "keygen") return run_keygen(args);
  if (cmd == "worker") return run_worker_cmd(args);
  if (cmd == "evolve") return run_evolve_cmd(args);
  if (cmd == "verify") return run_verify_cmd(args);
  if (cmd == "search-state") return run_search_state_cmd(args);
  if (cmd == "report") return run_report_cmd(args);
  if (cmd == "job-check") return run_job_check_cmd(args);
  if (cmd == "help") {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  return usage_error("unknown command '" + cmd + "' (kernelcraft --help lists them)");
}

}  // namespace

int fail(const std::string& msg) {
  std::fprintf(stderr, "kernelcraft: %s\n", msg.c_str());
  return kExitFailure;
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "kernelcraft: %s\n", msg.c_str());
  return kExitUsage;
}

void warn(const std::string& msg) { std::fprintf(stderr, "kernelcraft: warning: %s\n", msg.c_str()); }

void print_json(const nlohmann::json& j, bool compact) {
  std::string s = j.dump(compact ? -1 : 2, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace kc::cli

int main(int argc, char** argv) {
  // Everything below returns statuses; this is only the last guard against, say, bad_alloc.
  try {
    // Every run, the evaluation child's included: what crashed processes left in temp_root() goes.
    kc::sweep_stale_temp();
    // The evaluation child speaks its own line protocol (evolve/worker/child.h); no CLI parsing.
    if (argc > 1 && std::string(argv[1]) == "eval-child") return kc::evolve::eval_child_main(argc, argv);
    return kc::cli::run(argc, argv);
  } catch (const std::exception& e) {
    return kc::cli::fail(std::string("internal error: ") + e.what());
  }
}
