// Macro expansion for the static check; see preprocess.h.
#include "evolve/verify/preprocess.h"

#include <regex>

#include "runtime/config.h"
#include "runtime/fsutil.h"
#include "runtime/subprocess.h"
#include "runtime/temp_files.h"

namespace kc::evolve {
namespace {

// Every line that is an #include directive becomes empty (the newline stays, so the expanded
// text keeps the source's line count for the parts that are not macro bodies).
std::string blank_includes(const std::string& source) {
  static const std::regex kInclude(R"(^[ \t]*#[ \t]*include\b[^\n]*)", std::regex::multiline);
  return std::regex_replace(source, kInclude, "");
}

}  // namespace

Result<std::string> expand_macros(const std::string& source) {
  ScopedTempDir dir("cc");
  if (!dir.ok()) return Status::error(Code::kUnavailable, "no temporary directory for the preprocessor");
  if (!write_file(dir.file("kernel.cpp"), blank_includes(source)))
    return Status::error(Code::kUnavailable, "cannot write the preprocessor's input");
  std::vector<std::string> argv = split_command(load_config().cxx);
  if (argv.empty()) argv = {"c++"};
  // -P: no linemarkers; -w: a candidate's warnings are not this stage's business.
  for (const char* a : {"-E", "-P", "-w", "-x", "c++", "-o"}) argv.emplace_back(a);
  argv.push_back(dir.file("kernel.ii"));
  argv.push_back(dir.file("kernel.cpp"));
  ProcessOptions po;
  po.timeout_s = 30;
  po.output_path = dir.file("log");
  auto r = run_process(argv, po);
  if (!r) return r.status();
  if (!r.value().ok())
    return Status::error(Code::kCompileError, "the source does not preprocess: " + read_file(dir.file("log")).substr(0, 400));
  bool ok = false;
  std::string out = read_file(dir.file("kernel.ii"), &ok);
  if (!ok) return Status::error(Code::kUnavailable, "the preprocessor wrote nothing");
  return out;
}

}  // namespace kc::evolve
