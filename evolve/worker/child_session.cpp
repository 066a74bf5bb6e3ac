// The evaluation child's handle; see child_session.h.
#include "evolve/worker/child_session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace kc::evolve {

Status ChildSession::ensure() {
  if (child_) return Status::ok();
  if (starts_ >= 5) return Status::error(Code::kUnavailable, "the evaluation child failed to start 5 times: " + last_error_);
  ++starts_;
  auto c = PipedChild::spawn(argv_, {}, dir_.ok() ? dir_.file("stderr") : "");
  if (!c) return last_fail(c.status().to_string());
  child_ = std::move(c.value());
  auto line = child_->read_line(o_.setup_timeout_s);
  if (!line) return last_fail("no ready line: " + line.status().to_string() + died());
  auto j = nlohmann::json::parse(line.value(), nullptr, false);
  forward_stderr();
  if (j.is_discarded() || !j.value("ready", false))
    return last_fail(j.is_discarded() ? "bad ready line" : j.value("fatal", std::string("not ready")));
  ready_ = j;
  return Status::ok();
}

Result<nlohmann::json> ChildSession::evaluate(const std::string& id, const std::string& source, const nlohmann::json& launch,
                                              const std::string& mode) {
  auto v = request(id, source, launch, mode, "");
  if (v && v.value().value("stage", "") == "crash") explain_crash(v.value(), id, source, launch);
  return v;
}

Result<nlohmann::json> ChildSession::request(const std::string& id, const std::string& source, const nlohmann::json& launch,
                                             const std::string& mode, const std::string& set) {
  using Clock = std::chrono::steady_clock;
  for (int attempt = 0; attempt < 2; ++attempt) {
    KC_RETURN_IF_ERROR(ensure());
    nlohmann::json req = {{"id", id}, {"source", source}, {"launch", launch}, {"mode", mode}};
    if (!set.empty()) req["set"] = set;
    if (!child_->write_line(req.dump())) {   // died after its last answer (device fault): restart
      reset();
      continue;
    }
    last_at_ = nlohmann::json();
    const auto deadline = Clock::now() + std::chrono::duration<double>(o_.candidate_timeout_s);
    nlohmann::json j;
    for (;;) {   // progress lines ("at") until the verdict
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      auto line = child_->read_line(std::max(0.0, left));
      if (!line) {
        const bool hung = line.status().code() == Code::kTimeout;
        std::string why = hung ? "no answer within " + std::to_string(static_cast<int>(o_.candidate_timeout_s)) + " s (killed)"
                               : "the evaluation child died";
        std::string how = died();
        nlohmann::json v = crash_verdict(hung ? "timeout" : "crash", why + how, how);
        forward_stderr();
        reset();
        return v;
      }
      j = nlohmann::json::parse(line.value(), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("at") && j.value("id", "") == id) {
        last_at_ = j["at"];
        continue;
      }
      break;
    }
    forward_stderr();
    if (j.is_discarded() || !j.is_object() || j.value("id", "") != id || !j.contains("verdict")) {
      reset();
      return crash_verdict("crash", "garbled answer from the evaluation child", "");
    }
    starts_ = 0;
    // After a device fault the child exits once it has answered; start a fresh one next time
    // (writing to the dying one could blame the next candidate for its exit).
    if (j.value("context_lost", false)) reset();
    if (j.contains("peak_rss_mb")) j["verdict"]["peak_rss_mb"] = j["peak_rss_mb"];
    return j["verdict"];
  }
  return Status::error(Code::kUnavailable, "the evaluation child keeps dying before it reads a candidate");
}

void ChildSession::explain_crash(nlohmann::json& verdict, const std::string& id, const std::string& source,
                                 const nlohmann::json& launch) {
  if (!ready_.contains("call") || backend_from_name(ready_["call"].value("backend", "")) != BackendKind::kCpu) return;
  const nlohmann::json where = verdict["stages"][0]["evidence"].value("where", nlohmann::json::object());
  const std::string set = where.is_object() ? where.value("set", "") : "";
  if (set.empty()) return;   // it died outside a candidate call: nothing to replay
  auto v = request(id, source, launch, "sanitize", set);
  if (!v) return;
  const nlohmann::json crash = verdict["stages"][0];
  if (v.value().value("stage", "") == "sanitizer") {   // ASan names the access and its line
    verdict = v.value();
    verdict["stages"].insert(verdict["stages"].begin(), crash);
  } else {
    verdict["stages"][0]["evidence"]["asan"] = "no report replaying set '" + set + "' under AddressSanitizer";
  }
}

nlohmann::json ChildSession::crash_verdict(const std::string& stage, const std::string& why, const std::string& how) {
  nlohmann::json ev = {{"how", how}, {"stderr_tail", stderr_tail()}};
  if (last_at_.is_object()) ev["where"] = last_at_;
  std::string summary = why;
  if (last_at_.is_object()) {
    summary += " in stage " + last_at_.value("stage", std::string("?"));
    if (!last_at_.value("set", std::string()).empty())
      summary += ", set '" + last_at_.value("set", std::string()) + "', call " + std::to_string(last_at_.value("call", 0));
  }
  return {{"verified", false}, {"stage", stage},
          {"stages", {{{"name", stage}, {"outcome", "rejected"}, {"summary", summary}, {"evidence", ev}}}}};
}

std::string ChildSession::died() {
  if (!child_) return "";
  child_->kill_group();
  ProcessResult r = child_->wait(5);
  if (r.signal) return " (signal " + std::to_string(r.signal) + ": " + strsignal(r.signal) + ")";
  if (r.exited) return " (exit " + std::to_string(r.exit_code) + ")";
  return "";
}

// The last lines (at most ~4 KiB) the child wrote to stderr.
std::string ChildSession::stderr_tail() {
  if (!dir_.ok()) return "";
  std::ifstream f(dir_.file("stderr"), std::ios::binary | std::ios::ate);
  if (!f) return "";
  const long size = static_cast<long>(f.tellg());
  const long from = std::max(0L, size - 4096);
  std::string t(static_cast<size_t>(size - from), '\0');
  f.seekg(from);
  f.read(t.data(), static_cast<std::streamsize>(t.size()));
  if (from > 0 && t.find('\n') != std::string::npos) t.erase(0, t.find('\n') + 1);
  return t;
}

// What the child wrote to stderr since the last call goes on to ours (the worker's log).
void ChildSession::forward_stderr() {
  if (!dir_.ok()) return;
  std::ifstream f(dir_.file("stderr"), std::ios::binary);
  if (!f) return;
  f.seekg(forwarded_);
  std::string t((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (t.empty()) return;
  forwarded_ += static_cast<long>(t.size());
  std::fwrite(t.data(), 1, t.size(), stderr);
}

Status ChildSession::last_fail(const std::string& why) {
  last_error_ = why;
  reset();
  return Status::error(Code::kUnavailable, "evaluation child: " + why);
}

void ChildSession::reset() {
  if (child_) {
    child_->kill_group();
    child_->wait(5);
  }
  child_.reset();
}

}  // namespace kc::evolve
