// The CPU template tests' harness (test_templates_cpu.cpp): a compile cache shared by every test,
// calls and their input data, knob sampling, and run_family, which renders, compiles, loads and
// runs every case of a family against the double-precision references and checks that serial and
// threaded runs agree bit for bit. A new CPU template family needs only its cases.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"
#include "evolve/propose/proposer.h"

namespace kc::evolve {

uint64_t fnv(const std::string& s);
// A parallel_for over 3 std::threads with uneven parts, as at::parallel_for may split a range.
void threaded_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

struct Compiled {
  bool ok = false;
  std::string binary, log, error;
};
// Compiles every source not compiled yet, two at a time (the compiler runs as a child process).
void compile_all(const std::set<std::string>& sources);
// A source compile_all compiled.
const Compiled& compiled(const std::string& src);

struct Case {
  std::string label;
  OpCall call;
  double offset = 0;    // added to the main input (softmax / layer norm): exercises max subtraction,
                        // cancellation in the moments
  bool nan_row = false; // softmax: one element of row 3 is NaN
};

// The value of r, with a test failure when it is an error.
OpCall must(Result<OpCall> r);
OpCall cpu_call(OpId op, std::vector<int64_t> sizes, nlohmann::json args = nlohmann::json::object());
std::string shape_str(const std::vector<int64_t>& s);

struct Stats {
  int cases = 0, rendered = 0, unsupported = 0, ran = 0;
  std::set<std::string> sources;
  std::map<std::string, std::set<int64_t>> covered;   // knob -> values that ran
  // True when some run had knob != 0 (mode on) and some run had knob == 0.
  bool both(const std::string& knob) const {
    auto it = covered.find(knob);
    return it != covered.end() && it->second.count(0) && it->second.size() >= 2;
  }
};

// The CPU template for the case's op (exactly one per call).
const Template* cpu_template(const OpCall& c);
// Renders, compiles and runs every case with the default knobs and `n_random` random settings.
Stats run_family(const std::vector<Case>& cases, const char* family, int n_random = 6);

}  // namespace kc::evolve
