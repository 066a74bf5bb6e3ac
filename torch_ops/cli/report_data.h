// `kernelcraft report`'s data: a cache's records and search states gathered per key, per operator
// and for the whole cache. Typed values inside; to_json is the one writer of the report's JSON
// (`report --json`, and the block the HTML page embeds), so the page and --json never disagree.
#pragma once
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "evolve/verify/stage.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/backend.h"
#include "runtime/status.h"

namespace kc::cli {

constexpr int kReportFormat = 1;

// What the cache says about a key. The record states, plus: a served record that never passed the
// gauntlet (not served by default), a search state without a record (still running, or ended
// without storing: failed, skipped), and a record that does not decode.
enum class KeyState { kServed, kUnverified, kEagerBest, kDisabled, kSearching, kSearchEnded, kCorrupt };
const char* key_state_name(KeyState s);
constexpr KeyState kAllKeyStates[] = {KeyState::kServed,    KeyState::kUnverified,  KeyState::kEagerBest,
                                      KeyState::kDisabled,  KeyState::kSearching,   KeyState::kSearchEnded,
                                      KeyState::kCorrupt};

// Where a key's evolution time went, as far as the cache recorded it. search: the search's wall
// clock (every candidate through the search-mode gauntlet, compiles included; not split further,
// the search state keeps no per-stage times). verification / sanitizers: the full-gauntlet run the
// record keeps (its sanitizer stage separately); refused promotions keep no times.
struct TimeSpent {
  double search_s = 0, verification_s = 0, sanitizer_s = 0;
  TimeSpent& operator+=(const TimeSpent& o);
  double total() const { return search_s + verification_s + sanitizer_s; }
};

// One generation of a key's search (from the search state's evaluations).
struct GenerationBest {
  int generation = 0;
  int evaluated = 0;          // candidates the gauntlet ran ("unsupported" ones are not counted)
  int passed = 0;
  double best_ms = 0;         // fastest passed candidate of this generation; 0: none passed
  double best_so_far_ms = 0;  // fastest up to and including it; 0: none yet
};

// The candidate a record holds (meta.candidate); absent for hand-made and eager_best records.
struct Lineage {
  std::string id, family, origin;
  std::vector<std::string> parents;
  int generation = 0;
  nlohmann::json knobs = nlohmann::json::object();
};

struct KeyReport {
  std::string key, op;
  std::optional<BackendKind> backend;   // nullopt: the key's target does not parse
  KeyState state = KeyState::kServed;
  std::string error;                    // kCorrupt: why it does not decode
  Determinism determinism = Determinism::kUnknown;
  std::string provenance_by, recorded_at;
  // Timing as stored (0: not measured). eager_best: median_ms is the best candidate's search time.
  double median_ms = 0, eager_ms = 0, speedup = 0, speedup_p10 = 0;
  int pairs = 0;
  double copy_gb_s = 0;                 // the device's copy bandwidth timed beside it (0: none)
  // The least the call must move (each input read once, each output written once), from the key's
  // tensor metadata; 0 when the key does not parse into a call.
  double bytes = 0;
  std::optional<Lineage> lineage;
  bool has_search = false;              // a search state or meta.search exists
  int generations = 0, evaluated = 0;
  std::string finish_reason;
  double first_verified_s = 0, best_found_s = 0;
  std::vector<GenerationBest> curve;    // empty: no search state (hand-made, or written before it)
  std::vector<evolve::StageReport> stages;   // the stored gauntlet run (meta.verification.stages)
  nlohmann::json refused = nlohmann::json::array();    // promotions the full gauntlet refused
  nlohmann::json disabled = nlohmann::json::object();  // meta.disabled: the live check's evidence
  TimeSpent time;
};

// Sums over a set of keys: one operator, or the whole cache.
struct Totals {
  std::string op;                       // "" for the whole cache
  size_t keys = 0, evaluated = 0;
  std::map<KeyState, size_t> by_state;
  TimeSpent time;
  double best_speedup = 0;              // over served records (0: none)
  double geomean_speedup = 0;           // geometric mean over served records (0: none)
};

// A target's memory bandwidth peak: the median of the copy bandwidths its records measured, each
// timed by the full gauntlet beside the kernel it promoted (evidence "copy_gb_s"). Absent (not
// measured) for a target none of whose records carries one: never assumed.
struct PeakBandwidth {
  bool measured = false;
  double gb_per_s = 0;
  int samples = 0;
};

struct Report {
  std::string cache_dir, generated_at;
  std::vector<KeyReport> keys;          // by operator, then key
  std::vector<Totals> ops;              // by operator name
  Totals cache;
  std::map<std::string, PeakBandwidth> peaks;   // by target (the keys' second field)
  std::string peak_note;                        // how achieved bandwidth is put against a peak
  size_t damaged_regions = 0;           // blocks the scan could not read (cache repair salvages)
};

// Reads every record and search state of `store`. Never throws; a record that does not decode is a
// kCorrupt key, a search state that does not parse leaves the key without a curve.
Result<Report> collect_report(Store& store, const std::string& cache_dir);

// The peak of `key`'s target (not measured when the report has none for it).
const PeakBandwidth& peak_of(const Report& r, const std::string& key);

// GB/s for `bytes` in `ms` (0 when either is unknown).
double gb_per_s(double bytes, double ms);

nlohmann::json to_json(const Report& r);

}  // namespace kc::cli
