// `kernelcraft report [--out FILE.html]`: the cache as one self-contained HTML page
// (report_html.h), or with --json the same data as JSON (report_data.h). Reads the cache
// read-only, as `cache ls` does: a missing cache is an empty report, a damaged block a warning.
#include <cstdio>
#include <string>

#include "runtime/fsutil.h"
#include "torch_ops/cli/cli.h"
#include "torch_ops/cli/report_data.h"
#include "torch_ops/cli/report_html.h"

namespace kc::cli {

int run_report_cmd(const Args& args) {
  if (args.words.size() > 1) return usage_error("report: unexpected operand '" + args.words[1] + "'");
  auto st = open_cache_for_read(args);
  if (!st) return fail(st.status().message());
  auto rep = collect_report(*st.value(), args.cache_dir);
  if (!rep) return fail(rep.status().message());
  if (rep->damaged_regions)
    warn(std::to_string(rep->damaged_regions) + " damaged region(s) of the cache could not be read and were "
         "skipped; `kernelcraft cache repair` salvages what is left");
  const std::string out = args.value("out");
  // --json prints the data; the page is written only where --out asks for it alongside.
  if (args.json) print_json(to_json(rep.value()), true);
  if (out.empty()) {
    if (!args.json) std::fputs(render_report_html(rep.value()).c_str(), stdout);
    return kExitOk;
  }
  if (!write_file(out, render_report_html(rep.value()))) return fail("cannot write " + out);
  if (!args.json) std::printf("wrote %s (%zu keys)\n", out.c_str(), rep->keys.size());
  return kExitOk;
}

}  // namespace kc::cli
