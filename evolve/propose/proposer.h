// Proposers write candidate kernels for a call. Two kinds are peers behind one interface:
// templates with knobs (a template renders device code plus a launch spec for one call and one
// knob setting; the search samples, mutates and crosses knob settings) and free-form proposers
// (an LLM: whole kernels, asked once per generation, kept as text in the search state). Proposers
// never ship host code (docs/DESIGN.md "Launch specs").
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"
#include "runtime/status.h"

namespace kc::evolve {

using Knobs = std::map<std::string, int64_t>;

// One knob and the values it may take for a call (the first value is the template's default).
struct KnobDim {
  std::string name;
  std::vector<int64_t> values;
};

struct Candidate {
  std::string family;        // the template's name, e.g. "cuda.unary"
  Knobs knobs;
  std::string source;        // CUDA (NVRTC) or C++ (host compiler) source
  nlohmann::json launch;     // launch spec (runtime/launch_spec.h)
  std::vector<std::string> parents;   // ids of the candidates it was derived from
  std::string origin;        // "seed" | "mutation" | "crossover" | "user" | "llm"
  // False where its template knows the result may differ run to run (float atomics): recorded as
  // "varies" even when the gauntlet's runs happened to agree (they can, on indices that never
  // collide), so it is never served where the user asks for determinism.
  bool repeatable = true;
  // Stable identity: family + knobs (two candidates with the same id are the same variant).
  std::string id() const;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual const char* name() const = 0;      // the family of its candidates: "cuda.unary", "llm", ...
};

// A kernel a free-form proposer wrote, before the search gives it an id.
struct FreeformKernel {
  std::string source;
  nlohmann::json launch;
  std::vector<std::string> parents;   // ids of the kernels it was shown
};

// A verified kernel of the search, as a free-form proposer is shown it.
struct ShownKernel {
  std::string id;                              // family and knobs
  std::string source;
  nlohmann::json launch;
  double ms = 0;                               // verified median time
  nlohmann::json resources;                    // CUDA: registers, shared memory, spills per entry
};

// What the search has found so far, for a free-form proposer (Search::freeform_context).
struct FreeformContext {
  double eager_ms = 0;
  std::vector<ShownKernel> best;               // fastest first (a few)
  std::vector<std::string> failures;           // recent rejections: "id: verdict at stage: evidence"
  std::string last_rejection;                  // its own previous proposal's ("" if none or passed)
};

class FreeformProposer : public Proposer {
 public:
  // One kernel for `c`; parents: the ids of the kernels in ctx.best. Untrusted like every candidate.
  virtual Result<FreeformKernel> propose(const OpCall& c, const FreeformContext& ctx) const = 0;
};

class Template : public Proposer {
 public:
  virtual BackendKind backend() const = 0;
  // The knob space for `c`; empty when this template does not handle the call (op, dtype, layout).
  virtual std::vector<KnobDim> space(const OpCall& c) const = 0;
  // Renders source and launch spec. kUnsupported for a knob combination that is invalid for `c`
  // (e.g. a vector width that does not divide the row); never throws.
  virtual Result<Candidate> render(const OpCall& c, const Knobs& k) const = 0;
  // Settings besides the defaults that the search's first generation tries before random ones:
  // the best guess of another regime whose knobs must change together (a random sample rarely
  // finds those within a small budget). Knobs left out take their defaults.
  virtual std::vector<Knobs> seeds(const OpCall&) const { return {}; }
};

// Every template, CUDA and CPU.
const std::vector<const Template*>& all_templates();
// The templates that handle `c` on its backend (non-empty space()).
std::vector<const Template*> templates_for(const OpCall& c);

// Registration lists, one per file (templates_cuda.cpp, templates_cpu.cpp).
const std::vector<const Template*>& cuda_templates();
const std::vector<const Template*>& cpu_templates();
// Deliberately wrong templates for tests (planted.cpp); inert unless KERNELCRAFT_PLANTED is set.
const std::vector<const Template*>& planted_templates();

}  // namespace kc::evolve
