// The (mu+lambda) search over one key: seeds from every template that handles the call, then
// generations of lambda children (knob mutation and crossover of the mu best verified parents),
// never proposing a variant twice. Everything tried is in SearchState, which is persisted after
// every evaluation so a killed worker resumes where it stopped.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/propose/proposer.h"

namespace kc::evolve {

struct SearchOptions {
  int mu = 4;
  int lambda = 8;
  int max_generations = 8;
  int patience = 2;               // generations without a >1% improvement before stopping
  double target_speedup = 0;      // stop once best beats eager by this factor (0: off)
  int max_candidates = 96;        // evaluated candidates per key, all generations
  double key_budget_s = 600;      // wall clock per key across resumes
  uint64_t seed = 0x6b63;
};
nlohmann::json to_json(const SearchOptions& o);
// Missing fields keep their defaults; a wrong type or an out-of-range value is kInvalid.
Result<SearchOptions> search_options_from(const nlohmann::json& j);

// The outcome of one candidate through the gauntlet's search stages.
struct Evaluation {
  std::string id, family, origin;
  Knobs knobs;
  std::vector<std::string> parents;
  std::string verdict;            // "passed" | "rejected" | "unsupported" | "crash" | "timeout" | "error"
  std::string stage;              // the stage that decided a rejection ("compile", "numerics", ...)
  nlohmann::json evidence = nlohmann::json::object();
  double median_ms = 0, mad_ms = 0;   // passed: verified median time of one call
  int generation = 0;
  double at_s = 0;                // the search's elapsed time when it was decided (0: not recorded)
  bool passed() const { return verdict == "passed"; }
};
nlohmann::json to_json(const Evaluation& e);
Evaluation evaluation_from(const nlohmann::json& j);

struct SearchState {
  std::string key;
  int generation = 0;
  int stale = 0;                  // generations since the best improved by >1%
  double best_ms = 0;             // best verified median so far (0: none)
  double elapsed_s = 0;           // wall clock spent, across resumes
  bool finished = false;
  std::string finish_reason;
  std::vector<Evaluation> tried;  // every candidate, in order
  std::vector<nlohmann::json> pending;   // rendered but not yet evaluated: {family, knobs, parents, origin}
  // Kernels from free-form proposers (proposer.h), knob n = index here: {family, source, launch,
  // parents}. Unlike templates they cannot be rendered again, so the search state keeps their text.
  std::vector<nlohmann::json> proposals;
  int freeform_generation = -1;   // the last generation the free-form proposers were asked in
};
nlohmann::json to_json(const SearchState& s);
SearchState search_state_from(const nlohmann::json& j);   // throws on wrong types; see below
// A stored search state (JSON text from the cache): kCorrupt for anything search_state_from or
// the search would trip over later. Never throws.
Result<SearchState> parse_search_state(std::string_view text);

class Search {
 public:
  Search(OpCall call, SearchOptions opt, SearchState resumed = {});
  // The next candidates to evaluate: the pending ones of an interrupted generation first, else a
  // new generation. Empty when the search is over (see state().finished).
  std::vector<Candidate> next_batch();
  void report(const Evaluation& e);
  // Closes the current generation: updates best / stagnation, decides whether to stop.
  void end_generation(double eager_ms);
  void add_elapsed(double s) { st_.elapsed_s += s; }
  // Ends the search within a generation once its time is spent and something has passed (a key
  // whose candidates take seconds each would otherwise overrun its budget by a whole generation);
  // true when it did. The rest of the generation is dropped, not resumed.
  bool stop_if_out_of_time();
  const SearchState& state() const { return st_; }
  const SearchOptions& options() const { return opt_; }
  // Passed evaluations, fastest first.
  std::vector<const Evaluation*> ranked() const;
  // Seconds of search until the first verified candidate and until the best one (0: none yet).
  double first_verified_s() const;
  double best_found_s() const;
  const OpCall& call() const { return call_; }
  // Renders a tried or pending candidate again: a template's from its knobs (deterministic), a
  // free-form proposer's from the text the state keeps.
  Result<Candidate> render(const std::string& family, const Knobs& k) const;
  // Free-form proposers are asked once per generation from the second on (so that they are shown
  // the best template kernel); a kernel joins the current batch as a pending candidate of family
  // and origin who.name(). kInvalid for a kernel that proposer already proposed.
  bool freeform_due() const { return st_.generation >= 1 && st_.freeform_generation < st_.generation; }
  void freeform_asked() { st_.freeform_generation = st_.generation; }
  Result<Candidate> add_proposal(const Proposer& who, const FreeformKernel& k);
  // What `who` is shown: the fastest verified kernels, recent failures, and why its own last
  // kernel failed.
  FreeformContext freeform_context(const Proposer& who, double eager_ms) const;

 private:
  std::vector<Candidate> seeds();
  std::vector<Candidate> children();
  bool fresh(const Candidate& c) const { return seen_.count(c.id()) == 0; }
  void take(std::vector<Candidate>& out, Result<Candidate> c, std::set<std::string>& batch_ids);

  OpCall call_;
  SearchOptions opt_;
  SearchState st_;
  std::vector<const Template*> templates_;
  std::set<std::string> seen_;    // ids of everything tried or pending
  std::mt19937_64 rng_;
};

}  // namespace kc::evolve
