// (mu+lambda) over knob settings; see search.h.
#include "evolve/search/search.h"

#include <algorithm>
#include <functional>

#include "runtime/json_util.h"

namespace kc::evolve {

nlohmann::json to_json(const SearchOptions& o) {
  return {{"mu", o.mu}, {"lambda", o.lambda}, {"max_generations", o.max_generations}, {"patience", o.patience},
          {"target_speedup", o.target_speedup}, {"max_candidates", o.max_candidates},
          {"key_budget_s", o.key_budget_s}, {"seed", o.seed}};
}

Result<SearchOptions> search_options_from(const nlohmann::json& j) {
  SearchOptions o;
  if (j.is_null()) return o;
  if (!j.is_object()) return Status::error(Code::kInvalid, "search: not a map");
  // Bounds keep one generation (mu + lambda candidates) and the loops around it finite; 0 and
  // negative counts are clamped to 1 as before.
  constexpr int kMaxBatch = 1024, kMaxCount = 1 << 20;
  KC_RETURN_IF_ERROR(read_field(j, "mu", o.mu, -kMaxBatch, kMaxBatch));
  KC_RETURN_IF_ERROR(read_field(j, "lambda", o.lambda, -kMaxBatch, kMaxBatch));
  KC_RETURN_IF_ERROR(read_field(j, "max_generations", o.max_generations, -kMaxCount, kMaxCount));
  KC_RETURN_IF_ERROR(read_field(j, "patience", o.patience, -kMaxCount, kMaxCount));
  KC_RETURN_IF_ERROR(read_field(j, "target_speedup", o.target_speedup, 0.0, 1e6));
  KC_RETURN_IF_ERROR(read_field(j, "max_candidates", o.max_candidates, -kMaxCount, kMaxCount));
  KC_RETURN_IF_ERROR(read_field(j, "key_budget_s", o.key_budget_s, 0.0, 1e8));
  KC_RETURN_IF_ERROR(read_field(j, "seed", o.seed));
  for (int* v : {&o.mu, &o.lambda, &o.max_generations, &o.patience, &o.max_candidates}) *v = std::max(1, *v);
  return o;
}

nlohmann::json to_json(const Evaluation& e) {
  return {{"id", e.id}, {"family", e.family}, {"origin", e.origin}, {"knobs", e.knobs}, {"parents", e.parents},
          {"verdict", e.verdict}, {"stage", e.stage}, {"evidence", e.evidence}, {"median_ms", e.median_ms},
          {"mad_ms", e.mad_ms}, {"generation", e.generation}, {"at_s", e.at_s}};
}

Evaluation evaluation_from(const nlohmann::json& j) {
  Evaluation e;
  e.id = j.value("id", "");
  e.family = j.value("family", "");
  e.origin = j.value("origin", "");
  if (j.contains("knobs")) e.knobs = j["knobs"].get<Knobs>();
  if (j.contains("parents")) e.parents = j["parents"].get<std::vector<std::string>>();
  e.verdict = j.value("verdict", "error");
  e.stage = j.value("stage", "");
  e.evidence = j.value("evidence", nlohmann::json::object());
  e.median_ms = j.value("median_ms", 0.0);
  e.mad_ms = j.value("mad_ms", 0.0);
  e.generation = j.value("generation", 0);
  e.at_s = j.value("at_s", 0.0);   // absent in states written before it was recorded
  return e;
}

nlohmann::json to_json(const SearchState& s) {
  nlohmann::json tried = nlohmann::json::array();
  for (const auto& e : s.tried) tried.push_back(to_json(e));
  return {{"key", s.key}, {"generation", s.generation}, {"stale", s.stale}, {"best_ms", s.best_ms},
          {"elapsed_s", s.elapsed_s}, {"finished", s.finished}, {"finish_reason", s.finish_reason},
          {"tried", tried}, {"pending", s.pending}, {"proposals", s.proposals},
          {"freeform_generation", s.freeform_generation}};
}

SearchState search_state_from(const nlohmann::json& j) {
  SearchState s;
  s.key = j.value("key", "");
  s.generation = j.value("generation", 0);
  s.stale = j.value("stale", 0);
  s.best_ms = j.value("best_ms", 0.0);
  s.elapsed_s = j.value("elapsed_s", 0.0);
  s.finished = j.value("finished", false);
  s.finish_reason = j.value("finish_reason", "");
  if (j.contains("tried"))
    for (const auto& e : j["tried"]) s.tried.push_back(evaluation_from(e));
  if (j.contains("pending"))
    for (const auto& p : j["pending"]) s.pending.push_back(p);
  // States written before free-form proposers were named held the LLM's kernels only.
  if (j.contains("proposals") && j["proposals"].is_array())
    for (auto p : j["proposals"]) {
      if (p.is_object() && !p.contains("family")) p["family"] = "llm";
      s.proposals.push_back(p);
    }
  s.freeform_generation = j.value("freeform_generation", j.value("llm_generation", -1));
  return s;
}

Result<SearchState> parse_search_state(std::string_view text) {
  auto j = parse_json_text(text);
  if (!j) return j.status();
  if (!j.value().is_object()) return Status::error(Code::kCorrupt, "search state: not an object");
  // The fields are read with throwing accessors here and again by the search (pending entries,
  // LLM proposals); reading every one of them once, inside this boundary, means a damaged state
  // is refused here instead of throwing later on a worker thread.
  try {
    SearchState s = search_state_from(j.value());
    for (const auto& p : s.pending) {
      (void)p.value("id", std::string()), (void)p.value("family", std::string()), (void)p.value("origin", std::string());
      (void)p.value("knobs", Knobs{}), (void)p.value("parents", std::vector<std::string>{});
    }
    for (const auto& p : s.proposals) {
      (void)p.value("source", std::string()), (void)p.value("launch", nlohmann::json::object());
      (void)p.value("parents", std::vector<std::string>{});
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return Status::error(Code::kCorrupt, std::string("search state: ") + e.what());
  }
}

Search::Search(OpCall call, SearchOptions opt, SearchState resumed)
    : call_(std::move(call)), opt_(opt), st_(std::move(resumed)) {
  st_.key = call_.key;
  templates_ = templates_for(call_);
  for (const auto& e : st_.tried) seen_.insert(e.id);
  for (const auto& p : st_.pending) seen_.insert(p.value("id", ""));
  // Deterministic per key and resume point, so a resumed search explores what it would have.
  rng_.seed(opt_.seed ^ std::hash<std::string>{}(call_.key) ^ (st_.tried.size() * 0x9e3779b97f4a7c15ULL));
}

Result<Candidate> Search::render(const std::string& family, const Knobs& k) const {
  for (const Template* t : templates_)
    if (family == t->name()) return t->render(call_, k);
  auto n = k.find("n");
  if (n != k.end() && n->second >= 0 && n->second < static_cast<int64_t>(st_.proposals.size())) {
    const nlohmann::json& p = st_.proposals[static_cast<size_t>(n->second)];
    if (p.value("family", "") == family) {
      Candidate c;
      c.family = family;
      c.knobs = {{"n", n->second}};
      c.source = p.value("source", "");
      c.launch = p.value("launch", nlohmann::json::object());
      c.parents = p.value("parents", std::vector<std::string>{});
      c.origin = family;
      return c;
    }
  }
  return Status::error(Code::kNotFound, "no template or proposal " + family + " for this call");
}

std::vector<const Evaluation*> Search::ranked() const {
  std::vector<const Evaluation*> v;
  for (const auto& e : st_.tried)
    if (e.passed()) v.push_back(&e);
  std::stable_sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->median_ms < b->median_ms; });
  return v;
}

void Search::take(std::vector<Candidate>& out, Result<Candidate> c, std::set<std::string>& batch_ids) {
  if (!c) return;
  const std::string id = c.value().id();
  if (!fresh(c.value()) || batch_ids.count(id)) return;
  batch_ids.insert(id);
  out.push_back(std::move(c.value()));
}

namespace {
Knobs random_knobs(const std::vector<KnobDim>& space, std::mt19937_64& rng) {
  Knobs k;
  for (const auto& d : space) k[d.name] = d.values[rng() % d.values.size()];
  return k;
}
Knobs default_knobs(const std::vector<KnobDim>& space) {
  Knobs k;
  for (const auto& d : space) k[d.name] = d.values.front();
  return k;
}
}  // namespace

std::vector<Candidate> Search::seeds() {
  std::vector<Candidate> out;
  std::set<std::string> ids;
  if (templates_.empty()) return out;
  for (const Template* t : templates_) {
    const Knobs defaults = default_knobs(t->space(call_));
    auto c = t->render(call_, defaults);
    if (c) c.value().origin = "seed";
    take(out, std::move(c), ids);
    for (Knobs k : t->seeds(call_)) {
      for (const auto& [name, v] : defaults) k.emplace(name, v);
      auto s = t->render(call_, k);
      if (s) s.value().origin = "seed";
      take(out, std::move(s), ids);
    }
  }
  for (int attempt = 0; static_cast<int>(out.size()) < opt_.lambda && attempt < 50 * opt_.lambda; ++attempt) {
    const Template* t = templates_[attempt % templates_.size()];
    auto c = t->render(call_, random_knobs(t->space(call_), rng_));
    if (c) c.value().origin = "seed";
    take(out, std::move(c), ids);
  }
  return out;
}

std::vector<Candidate> Search::children() {
  std::vector<Candidate> out;
  std::set<std::string> ids;
  auto parents = ranked();
  if (parents.size() > static_cast<size_t>(opt_.mu)) parents.resize(opt_.mu);
  if (parents.empty()) return seeds();   // nothing verified yet: keep sampling the spaces
  std::uniform_real_distribution<double> u(0, 1);
  for (int attempt = 0; static_cast<int>(out.size()) < opt_.lambda && attempt < 50 * opt_.lambda; ++attempt) {
    const Evaluation* a = parents[rng_() % parents.size()];
    const Template* t = nullptr;
    for (const Template* x : templates_)
      if (a->family == x->name()) t = x;
    if (!t) continue;
    auto space = t->space(call_);
    Knobs k = a->knobs;
    std::vector<std::string> lineage = {a->id};
    std::string origin = "mutation";
    std::vector<const Evaluation*> mates;
    for (const Evaluation* b : parents)
      if (b != a && b->family == a->family) mates.push_back(b);
    if (!mates.empty() && u(rng_) < 0.35) {
      const Evaluation* b = mates[rng_() % mates.size()];
      for (auto& [name, v] : k)
        if (b->knobs.count(name) && (rng_() & 1)) v = b->knobs.at(name);
      lineage.push_back(b->id);
      origin = "crossover";
    }
    // Mutate one knob (two, a third of the time); always after a crossover that changed nothing.
    int flips = origin == "mutation" ? (u(rng_) < 0.33 ? 2 : 1) : (k == a->knobs ? 1 : 0);
    for (int f = 0; f < flips && !space.empty(); ++f) {
      const KnobDim& d = space[rng_() % space.size()];
      if (d.values.size() < 2) continue;
      int64_t v = k.count(d.name) ? k[d.name] : d.values.front();
      int64_t nv = v;
      while (nv == v) nv = d.values[rng_() % d.values.size()];
      k[d.name] = nv;
    }
    auto c = t->render(call_, k);
    if (c) {
      c.value().origin = origin;
      c.value().parents = lineage;
    }
    take(out, std::move(c), ids);
  }
  return out;
}

std::vector<Candidate> Search::next_batch() {
  if (st_.finished) return {};
  std::vector<Candidate> out;
  if (!st_.pending.empty()) {
    for (const auto& p : st_.pending) {
      auto c = render(p.value("family", ""), p.value("knobs", Knobs{}));
      if (!c) continue;
      c.value().origin = p.value("origin", "");
      c.value().parents = p.value("parents", std::vector<std::string>{});
      out.push_back(std::move(c.value()));
    }
    if (!out.empty()) return out;
  }
  if (templates_.empty()) {
    st_.finished = true;
    st_.finish_reason = "no template handles this call";
    return {};
  }
  out = st_.generation == 0 ? seeds() : children();
  st_.pending.clear();
  for (const auto& c : out) {
    st_.pending.push_back({{"id", c.id()}, {"family", c.family}, {"knobs", c.knobs}, {"parents", c.parents},
                           {"origin", c.origin}});
    seen_.insert(c.id());
  }
  if (out.empty()) {
    st_.finished = true;
    st_.finish_reason = "search space exhausted";
  }
  return out;
}

Result<Candidate> Search::add_proposal(const Proposer& who, const FreeformKernel& k) {
  const std::string family = who.name();
  for (const auto& p : st_.proposals)
    if (p.value("family", "") == family && p.value("source", "") == k.source && p.value("launch", nlohmann::json()) == k.launch)
      return Status::error(Code::kInvalid, family + " proposed a kernel it had proposed before");
  st_.proposals.push_back({{"family", family}, {"source", k.source}, {"launch", k.launch}, {"parents", k.parents}});
  auto c = render(family, {{"n", static_cast<int64_t>(st_.proposals.size() - 1)}});
  if (!c) return c.status();
  st_.pending.push_back({{"id", c.value().id()}, {"family", family}, {"knobs", c.value().knobs},
                         {"parents", k.parents}, {"origin", family}});
  seen_.insert(c.value().id());
  return c;
}

FreeformContext Search::freeform_context(const Proposer& who, double eager_ms) const {
  constexpr size_t kShownKernels = 3, kShownFailures = 3;
  auto brief = [](const Evaluation& e) {
    return e.id + ": " + e.verdict + " at stage " + e.stage + ": " +
           e.evidence.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 1500);
  };
  FreeformContext ctx;
  ctx.eager_ms = eager_ms;
  for (const Evaluation* e : ranked()) {
    if (ctx.best.size() == kShownKernels) break;
    auto k = render(e->family, e->knobs);
    if (!k) continue;
    ctx.best.push_back({e->id, k.value().source, k.value().launch, e->median_ms,
                        e->evidence.value("resources", nlohmann::json())});
  }
  bool own_seen = false;
  for (auto it = st_.tried.rbegin(); it != st_.tried.rend(); ++it) {
    if (it->origin == who.name() && !own_seen) {   // its own latest: the direct feedback
      own_seen = true;
      if (!it->passed()) ctx.last_rejection = brief(*it);
      continue;
    }
    if (!it->passed() && it->verdict != "unsupported" && ctx.failures.size() < kShownFailures)
      ctx.failures.push_back(brief(*it));
  }
  return ctx;
}

void Search::report(const Evaluation& e) {
  Evaluation x = e;
  x.generation = st_.generation;
  seen_.insert(x.id);
  st_.pending.erase(std::remove_if(st_.pending.begin(), st_.pending.end(),
                                   [&](const nlohmann::json& p) { return p.value("id", "") == x.id; }),
                    st_.pending.end());
  st_.tried.push_back(std::move(x));
}

double Search::first_verified_s() const {
  for (const auto& e : st_.tried)
    if (e.passed()) return e.at_s;
  return 0;
}

double Search::best_found_s() const {
  auto r = ranked();
  return r.empty() ? 0 : r.front()->at_s;
}

bool Search::stop_if_out_of_time() {
  if (st_.elapsed_s < opt_.key_budget_s || ranked().empty()) return false;
  st_.pending.clear();
  st_.finished = true;
  st_.finish_reason = "per-key time budget";
  return true;
}

void Search::end_generation(double eager_ms) {
  if (!st_.pending.empty()) return;   // interrupted: the generation resumes later
  auto r = ranked();
  double best = r.empty() ? 0 : r.front()->median_ms;
  if (best > 0 && (st_.best_ms == 0 || best < st_.best_ms * 0.99)) {
    st_.best_ms = best;
    st_.stale = 0;
  } else {
    ++st_.stale;
  }
  ++st_.generation;
  int evaluated = 0;
  for (const auto& e : st_.tried) evaluated += e.verdict != "unsupported";
  auto stop = [&](const char* why) {
    st_.finished = true;
    st_.finish_reason = why;
  };
  if (opt_.target_speedup > 0 && best > 0 && eager_ms / best >= opt_.target_speedup) stop("target speedup reached");
  else if (st_.stale >= opt_.patience) stop("stagnation");
  else if (st_.generation >= opt_.max_generations) stop("generation limit");
  else if (evaluated >= opt_.max_candidates) stop("candidate limit");
  else if (st_.elapsed_s >= opt_.key_budget_s) stop("per-key time budget");
}

}  // namespace kc::evolve
