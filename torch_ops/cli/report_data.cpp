// Gathers `kernelcraft report`'s data from a cache (see report_data.h). Record meta is free-form
// JSON written by several versions of the worker and the CLI, so every field is read as optional
// and of the expected type, or not at all.
#include "torch_ops/cli/report_data.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "evolve/ops/op_call.h"
#include "evolve/search/search.h"
#include "evolve/verify/memory_cap.h"
#include "evolve/worker/worker.h"
#include "evolve/worker/worker_steps.h"
#include "kernel_cache/key.h"

namespace kc::cli {
namespace {

using nlohmann::json;

const json& field(const json& j, const char* k) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(k);
  return it == j.end() ? kNull : *it;
}
double num(const json& j, const char* k) {
  const json& v = field(j, k);
  return v.is_number() ? v.get<double>() : 0;
}
std::string text(const json& j, const char* k) {
  const json& v = field(j, k);
  return v.is_string() ? v.get<std::string>() : std::string();
}
std::vector<std::string> strings(const json& j, const char* k) {
  std::vector<std::string> out;
  for (const auto& v : field(j, k))
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}
// Unknown numbers are null in the JSON, never a made-up 0.
json known(double v) { return v > 0 && std::isfinite(v) ? json(v) : json(nullptr); }

std::string iso_of_epoch(int64_t t) {
  char buf[32];
  std::time_t tt = static_cast<std::time_t>(t);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
  return buf;
}

KeyState state_of(const Record& r) {
  switch (r.state) {
    case RecordState::kServed: return record_verified(r) ? KeyState::kServed : KeyState::kUnverified;
    case RecordState::kEagerBest: return KeyState::kEagerBest;
    case RecordState::kDisabled: return KeyState::kDisabled;
  }
  return KeyState::kCorrupt;
}

// Timing, whichever writer made the record: the worker's meta.timing (interleaved pairs), an
// eager_best record's eager and best-candidate times, or `cache put --verify`'s verification.
void read_timing(KeyReport& k, const json& meta) {
  if (const json& t = field(meta, "timing"); t.is_object()) {
    k.median_ms = num(t, "median_ms");
    k.eager_ms = num(t, "eager_median_ms");
    k.speedup = num(t, "speedup");
    k.speedup_p10 = num(t, "speedup_p10");
    k.pairs = static_cast<int>(num(t, "pairs"));
    k.copy_gb_s = num(t, "copy_gb_s");
  } else if (k.state == KeyState::kEagerBest) {
    k.eager_ms = num(meta, "eager_median_ms");
    k.median_ms = num(meta, "best_candidate_ms");
  } else {
    k.median_ms = num(field(meta, "verification"), "median_ms");
    k.eager_ms = num(field(meta, "verification"), "eager_median_ms");
    k.copy_gb_s = num(field(meta, "verification"), "copy_gb_s");
  }
  if (k.speedup <= 0 && k.median_ms > 0 && k.eager_ms > 0) k.speedup = k.eager_ms / k.median_ms;
}

void read_lineage(KeyReport& k, const json& meta) {
  const json& c = field(meta, "candidate");
  if (!c.is_object()) return;
  Lineage l;
  l.id = text(c, "id");
  l.family = text(c, "family");
  l.origin = text(c, "origin");
  l.parents = strings(c, "parents");
  l.generation = static_cast<int>(num(c, "generation"));
  if (const json& kn = field(c, "knobs"); kn.is_object()) l.knobs = kn;
  k.lineage = std::move(l);
}

void read_search_meta(KeyReport& k, const json& meta) {
  const json& s = field(meta, "search");
  if (!s.is_object()) return;
  k.has_search = true;
  k.generations = static_cast<int>(num(s, "generations"));
  k.evaluated = static_cast<int>(num(s, "evaluated"));
  k.finish_reason = text(s, "finish_reason");
  k.first_verified_s = num(s, "first_verified_s");
  k.best_found_s = num(s, "best_found_s");
  k.time.search_s = num(s, "elapsed_s");
  if (const json& r = field(s, "refused"); r.is_array()) k.refused = r;
}

// The stored gauntlet run, and its time with the sanitizers apart.
void read_stages(KeyReport& k, const json& meta) {
  for (const auto& s : field(field(meta, "verification"), "stages")) {
    // A stage this build does not know (a newer writer) is left out rather than shown misnamed.
    if (!s.is_object() || !evolve::stage_from_name(text(s, "name"))) continue;
    evolve::StageReport rep;
    try {   // from_json reads with throwing accessors; a stage of the wrong shape is left out
      rep = evolve::StageReport::from_json(s, evolve::StageId::kStatic);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    (rep.id == evolve::StageId::kSanitizer ? k.time.sanitizer_s : k.time.verification_s) += rep.millis / 1e3;
    k.stages.push_back(std::move(rep));
  }
}

void read_record(KeyReport& k, const Record& r) {
  k.op = r.op;
  k.backend = r.backend;
  k.state = state_of(r);
  k.determinism = r.determinism;
  const json& prov = field(r.meta, "provenance");
  k.provenance_by = text(prov, "by");
  k.recorded_at = text(prov, "at");
  if (k.recorded_at.empty() && field(prov, "created").is_number_integer())
    k.recorded_at = iso_of_epoch(field(prov, "created").get<int64_t>());
  read_timing(k, r.meta);
  read_lineage(k, r.meta);
  read_search_meta(k, r.meta);
  read_stages(k, r.meta);
  if (const json& d = field(r.meta, "disabled"); d.is_object()) k.disabled = d;
}

// The search state is the full history: the per-generation curve comes from its evaluations,
// and its clock counts every resume.
void read_search_state(KeyReport& k, const evolve::SearchState& st) {
  k.has_search = true;
  int last = -1;
  for (const auto& e : st.tried) last = std::max(last, e.generation);
  k.curve.assign(static_cast<size_t>(last + 1), GenerationBest{});
  for (size_t g = 0; g < k.curve.size(); ++g) k.curve[g].generation = static_cast<int>(g);
  for (const auto& e : st.tried) {
    if (e.generation < 0 || e.verdict == "unsupported") continue;
    GenerationBest& g = k.curve[static_cast<size_t>(e.generation)];
    ++g.evaluated;
    if (!e.passed() || e.median_ms <= 0) continue;
    ++g.passed;
    if (g.best_ms == 0 || e.median_ms < g.best_ms) g.best_ms = e.median_ms;
  }
  double best = 0;
  for (auto& g : k.curve) {
    if (g.best_ms > 0 && (best == 0 || g.best_ms < best)) best = g.best_ms;
    g.best_so_far_ms = best;
  }
  k.generations = std::max(k.generations, st.generation);
  k.evaluated = std::max(k.evaluated, static_cast<int>(st.tried.size()));
  if (k.finish_reason.empty()) k.finish_reason = st.finish_reason;
  k.time.search_s = std::max(k.time.search_s, st.elapsed_s);
}

// A key the cache has a search for but no record: still running, or ended without storing one.
KeyReport search_only(const std::string& key, const evolve::SearchState& st) {
  KeyReport k;
  k.key = key;
  k.op = key_op(key);
  if (auto t = parse_target(key_target(key))) k.backend = t->kind;
  k.state = st.finished ? KeyState::kSearchEnded : KeyState::kSearching;
  return k;
}

double call_bytes(const std::string& key) {
  auto call = evolve::call_from_key(key);
  return call ? static_cast<double>(evolve::call_tensor_bytes(call.value())) : 0;
}

Totals totals_of(const std::string& op, const std::vector<KeyReport>& keys) {
  Totals t;
  t.op = op;
  double log_sum = 0;
  size_t served = 0;
  for (const auto& k : keys) {
    if (!op.empty() && k.op != op) continue;
    ++t.keys;
    t.evaluated += static_cast<size_t>(k.evaluated);
    ++t.by_state[k.state];
    t.time += k.time;
    if (k.state != KeyState::kServed || k.speedup <= 0) continue;
    t.best_speedup = std::max(t.best_speedup, k.speedup);
    log_sum += std::log(k.speedup);
    ++served;
  }
  if (served) t.geomean_speedup = std::exp(log_sum / static_cast<double>(served));
  return t;
}

json to_json(const TimeSpent& t) {
  return {{"search_s", t.search_s}, {"verification_s", t.verification_s}, {"sanitizer_s", t.sanitizer_s},
          {"total_s", t.total()}};
}

json to_json(const Totals& t) {
  json states = json::object();
  for (KeyState s : kAllKeyStates) states[key_state_name(s)] = t.by_state.count(s) ? t.by_state.at(s) : 0;
  return {{"op", t.op}, {"keys", t.keys}, {"evaluated", t.evaluated}, {"by_state", states},
          {"time", to_json(t.time)}, {"best_speedup", known(t.best_speedup)},
          {"geomean_speedup", known(t.geomean_speedup)}};
}

json search_json(const KeyReport& k) {
  json curve = json::array();
  for (const auto& g : k.curve)
    curve.push_back({{"generation", g.generation}, {"evaluated", g.evaluated}, {"passed", g.passed},
                     {"best_ms", known(g.best_ms)}, {"best_so_far_ms", known(g.best_so_far_ms)}});
  return {{"recorded", k.has_search}, {"generations", k.generations}, {"evaluated", k.evaluated},
          {"finish_reason", k.finish_reason}, {"first_verified_s", known(k.first_verified_s)},
          {"best_found_s", known(k.best_found_s)}, {"curve", curve}, {"refused", k.refused}};
}

std::map<std::string, PeakBandwidth> peaks_by_target(const std::vector<KeyReport>& keys) {
  std::map<std::string, std::vector<double>> seen;
  for (const auto& k : keys)
    if (k.copy_gb_s > 0) seen[key_target(k.key)].push_back(k.copy_gb_s);
  std::map<std::string, PeakBandwidth> out;
  for (auto& [target, v] : seen) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    out[target] = {true, n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, static_cast<int>(n)};
  }
  return out;
}

json to_json(const KeyReport& k, const PeakBandwidth& peak) {
  const double gbs = gb_per_s(k.bytes, k.median_ms);
  json stages = json::array();
  for (const auto& s : k.stages) stages.push_back(s.to_json());
  json lineage = nullptr;
  if (k.lineage)
    lineage = {{"id", k.lineage->id}, {"family", k.lineage->family}, {"origin", k.lineage->origin},
               {"parents", k.lineage->parents}, {"generation", k.lineage->generation}, {"knobs", k.lineage->knobs}};
  return {{"key", k.key}, {"op", k.op}, {"backend", k.backend ? json(backend_name(*k.backend)) : json(nullptr)},
          {"state", key_state_name(k.state)}, {"error", k.error}, {"determinism", determinism_name(k.determinism)},
          {"provenance", {{"by", k.provenance_by}, {"at", k.recorded_at}}},
          {"timing", {{"median_ms", known(k.median_ms)}, {"eager_median_ms", known(k.eager_ms)},
                      {"speedup", known(k.speedup)}, {"speedup_p10", known(k.speedup_p10)}, {"pairs", k.pairs}}},
          {"bandwidth", {{"bytes", known(k.bytes)}, {"gb_per_s", known(gbs)},
                         {"eager_gb_per_s", known(gb_per_s(k.bytes, k.eager_ms))},
                         {"fraction_of_peak", peak.measured ? known(gbs / peak.gb_per_s) : json(nullptr)},
                         {"copy_gb_s", known(k.copy_gb_s)}}},
          {"lineage", lineage}, {"search", search_json(k)}, {"stages", stages}, {"disabled", k.disabled},
          {"time", to_json(k.time)}};
}

}  // namespace

const char* key_state_name(KeyState s) {
  switch (s) {
    case KeyState::kServed: return "served";
    case KeyState::kUnverified: return "unverified";
    case KeyState::kEagerBest: return "eager_best";
    case KeyState::kDisabled: return "disabled";
    case KeyState::kSearching: return "searching";
    case KeyState::kSearchEnded: return "search_ended";
    case KeyState::kCorrupt: return "corrupt";
  }
  return "corrupt";
}

TimeSpent& TimeSpent::operator+=(const TimeSpent& o) {
  search_s += o.search_s;
  verification_s += o.verification_s;
  sanitizer_s += o.sanitizer_s;
  return *this;
}

double gb_per_s(double bytes, double ms) { return bytes > 0 && ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }

Result<Report> collect_report(Store& store, const std::string& cache_dir) {
  Report rep;
  rep.cache_dir = cache_dir;
  rep.generated_at = evolve::iso_now();
  std::map<std::string, KeyReport> keys;
  Status s = store.scan(kRecordKeyPrefix, [&](const std::string& key, const std::string& value) {
    KeyReport& k = keys[key];
    k.key = key;
    k.op = key_op(key);
    auto rec = decode_record(value);
    // The field readers check types; a throw would be a bug, and one record must not end the report.
    try {
      if (rec) {
        read_record(k, rec.value());
      } else {
        k.state = KeyState::kCorrupt;
        k.error = rec.status().to_string();
      }
    } catch (const nlohmann::json::exception& e) {
      k.state = KeyState::kCorrupt;
      k.error = std::string("meta: ") + e.what();
    }
    return true;
  }, &rep.damaged_regions);
  if (!s) return s;
  const std::string prefix = search_state_key("");
  s = store.scan(prefix, [&](const std::string& skey, const std::string& value) {
    auto st = evolve::parse_search_state(value);
    if (!st) return true;   // a damaged state only costs the curve; the worker says so when it resumes
    const std::string key = skey.substr(prefix.size());
    auto it = keys.find(key);
    if (it == keys.end()) it = keys.emplace(key, search_only(key, st.value())).first;
    read_search_state(it->second, st.value());
    return true;
  }, &rep.damaged_regions);
  if (!s) return s;
  for (auto& [key, k] : keys) {
    k.bytes = call_bytes(key);
    rep.keys.push_back(std::move(k));
  }
  std::stable_sort(rep.keys.begin(), rep.keys.end(), [](const KeyReport& a, const KeyReport& b) { return a.op < b.op; });
  for (const auto& k : rep.keys)
    if (rep.ops.empty() || rep.ops.back().op != k.op) rep.ops.push_back(totals_of(k.op, rep.keys));
  rep.cache = totals_of("", rep.keys);
  rep.peaks = peaks_by_target(rep.keys);
  rep.peak_note = "bandwidth: the least bytes the call moves over its median time; peak: the median copy "
                  "bandwidth (read + write) the full gauntlet timed beside each promoted kernel of the target";
  if (rep.peaks.empty()) rep.peak_note += " (peak not measured: no record here carries one)";
  return rep;
}

const PeakBandwidth& peak_of(const Report& r, const std::string& key) {
  static const PeakBandwidth none;
  auto it = r.peaks.find(key_target(key));
  return it == r.peaks.end() ? none : it->second;
}

json to_json(const Report& r) {
  json keys = json::array(), ops = json::array();
  for (const auto& k : r.keys) keys.push_back(to_json(k, peak_of(r, k.key)));
  json peaks = json::object();
  for (const auto& [target, p] : r.peaks) peaks[target] = {{"gb_per_s", p.gb_per_s}, {"samples", p.samples}};
  for (const auto& o : r.ops) ops.push_back(to_json(o));
  return {{"report_format", kReportFormat}, {"cache_dir", r.cache_dir}, {"generated_at", r.generated_at},
          {"damaged_regions", r.damaged_regions},
          {"peak", {{"measured", !r.peaks.empty()}, {"targets", peaks}, {"note", r.peak_note}}},
          {"cache", to_json(r.cache)}, {"ops", ops}, {"keys", keys}};
}

}  // namespace kc::cli
