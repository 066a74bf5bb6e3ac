// Job-wide coordination, its records half: a finished search's record is published to the job
// store, peers' records are imported into this node's cache, and the search state of an owned key
// is shipped with each renewal and adopted on a take-over. The protocol is in coordinator.h.
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dispatcher/coordinator_impl.h"
#include "kernel_cache/bundle.h"
#include "kernel_cache/key.h"
#include "kernel_cache/record.h"
#include "kernel_cache/store.h"
#include "runtime/fsutil.h"
#include "runtime/json_util.h"
#include "runtime/log.h"

namespace kc::dispatch::coord {
namespace {

constexpr size_t kMaxStashed = 4096;   // records of targets not seen here yet, kept for later

// This cache's search state of `key` ("" when it has none yet).
std::string local_search_state(const std::string& key) {
  auto local = Store::open(State::get().table().dir(), Store::Mode::kReadOnly);
  if (!local) return "";
  auto v = local.value()->get(search_state_key(key));
  return v ? v.value() : "";
}

}  // namespace

std::string record_key(int64_t i) { return "record/" + std::to_string(i); }
std::string state_key(const std::string& key) { return "state/" + fnv1a64_hex(key); }

// The search of an owned key ended here: its record (served or eager_best) goes to the store,
// then the claim says "ended", so waiting nodes know a record is on its way (or none is).
Status Coordinator::finish(const std::string& key, const Owned& o) {
  std::shared_ptr<Record> rec;
  {
    auto local = Store::open(State::get().table().dir(), Store::Mode::kReadOnly);
    if (local) {
      auto bytes = local.value()->get(key);
      if (bytes)
        if (auto r = decode_record(bytes.value()); r && r->state != RecordState::kDisabled)
          rec = std::make_shared<Record>(std::move(r.value()));
    }
  }
  if (rec) {
    auto bundle = bundle_of({*rec});
    if (bundle) {
      std::string entry;
      json::to_cbor(json{{"owner", me_}, {"key", key},
                         {"bundle", json::binary_t(std::vector<uint8_t>(bundle->begin(), bundle->end()))}},
                    entry);
      auto n = call([&](JobStore& s) { return s.add("records", 1); });
      if (!n) return n.status();
      Status st = call([&](JobStore& s) { return s.set(record_key(n.value() - 1), entry); });
      KC_RETURN_IF_ERROR(st);
      std::lock_guard<std::mutex> g(mu_);
      ++published_;
    }
  }
  if (o.lost) return Status::ok();
  const std::string ended = claim_value(key, o.beat + 1, "ended", rec != nullptr);
  auto now = call([&](JobStore& s) { return s.compare_set(claim_key(key), o.claim, ended); });
  return now ? Status::ok() : now.status();
}

// With each renewal the search state goes to the store, so that a node taking the key over
// resumes from it instead of starting afresh. Best effort: a failure only costs that head start.
// Called without mu_ held.
void Coordinator::ship_state(const std::string& key) {
  const std::string st = local_search_state(key);
  if (st.empty()) return;
  (void)call([&](JobStore& s) { return s.set(state_key(key), st); });
}

// A taken-over key's last shipped search state becomes this cache's, unless it has one. Safe to
// take from a peer: the state names candidates by family and knobs, which are rendered again
// here, and whatever is promoted from it still passes the full gauntlet here.
void Coordinator::adopt_state(const std::string& key, const std::string& from) {
  auto st = call([&](JobStore& s) { return s.get(state_key(key)); });
  if (!st || st.value().empty() || !local_search_state(key).empty()) return;
  auto local = Store::open(State::get().table().dir(), Store::Mode::kWriter, 10000);
  if (!local || !local.value()->put(search_state_key(key), st.value())) {
    log(LogLevel::kInfo, "kernelcraft: could not keep the search state of " + key + " from " + from +
                             "; searching it from the start");
    return;
  }
  ++resumed_;
  log(LogLevel::kInfo, "kernelcraft: " + key + " resumes from the search state " + from + " shipped");
}

// Reads records published since the last round and imports those of this process's targets.
Status Coordinator::read_records(const Config& c) {
  auto n = call([&](JobStore& s) { return s.add("records", 0); });
  if (!n) return n.status();
  {
    std::set<std::string> targets;
    {
      std::lock_guard<std::mutex> g(mu_);
      targets = targets_;
    }
    std::vector<Published> later;
    for (Published& p : stash_) {
      if (!targets.count(key_target(p.key))) {
        later.push_back(std::move(p));
        continue;
      }
      if (stopping_.load()) return Status::ok();
      import(p);
      KC_RETURN_IF_ERROR(renew_due(c));
    }
    stash_ = std::move(later);
  }
  while (next_record_ < n.value()) {
    auto v = call([&](JobStore& s) { return s.get(record_key(next_record_)); });
    if (!v && v.status().code() != Code::kNotFound) return v.status();
    if (!v) {   // counted, not written yet; a publisher that died in between leaves a hole
      if (hole_since_ == Clock::time_point{}) hole_since_ = Clock::now();
      if (Clock::now() - hole_since_ < std::chrono::duration<double>(c.job_lease_s)) break;
      hole_since_ = {};
      ++next_record_;
      continue;
    }
    hole_since_ = {};
    ++next_record_;
    auto j = parse_cbor(v.value());
    if (!j || !j.value().is_object() || !j.value().contains("bundle") || !j.value()["bundle"].is_binary()) continue;
    const auto& b = j.value()["bundle"].get_binary();
    Published p{j.value().value("owner", ""), j.value().value("key", ""), std::string(b.begin(), b.end())};
    if (p.owner == me_ || p.key.empty()) continue;
    bool known = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      known = targets_.count(key_target(p.key)) > 0;
    }
    if (stopping_.load()) return Status::ok();
    if (known) {
      import(p);
      KC_RETURN_IF_ERROR(renew_due(c));
    } else if (stash_.size() < kMaxStashed) {
      stash_.push_back(std::move(p));
    }
  }
  return Status::ok();
}

// A peer's record into this node's cache, through bundle import: rebuilt here, stored only if the
// binary's hash matches, kept if this cache already has a record for the key. Refused: searched here.
void Coordinator::import(const Published& p) {
  ImportOptions opts;
  opts.overwrite = false;
  opts.job_peer = p.owner;
  Status why = Status::ok();
  {
    auto store = Store::open(State::get().table().dir(), Store::Mode::kWriter, 10000);
    if (!store) {
      why = store.status();
    } else {
      auto st = import_bundle_bytes(*store.value(), p.bundle, "the job store (" + p.owner + ")", opts);
      if (!st) why = st.status();
      else if (st->rejected > 0) why = Status::error(Code::kRejected, st->errors.empty() ? "refused" : st->errors[0]);
    }
  }
  std::unique_lock<std::mutex> g(mu_);
  if (why) {
    ++imported_;
    waiting_.erase(p.key);
    return;
  }
  ++refused_;
  g.unlock();
  log_once(LogLevel::kWarn, "job-import-" + p.key, "kernelcraft: the record of " + p.key + " from " + p.owner +
                                                       " is not taken here (" + why.message() + "); searching it here");
  go_local(p.key);
}

}  // namespace kc::dispatch::coord
