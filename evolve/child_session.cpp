// The evaluation child's handle; see child_session.h.
#include "evolve/child_session.h"

#include <cstring>

namespace kc::evolve {

Status ChildSession::ensure() {
  if (child_) return Status::ok();
  if (starts_ >= 5) return Status::error(Code::kUnavailable, "the evaluation child failed to start 5 times: " + last_error_);
  ++starts_;
  auto c = PipedChild::spawn(argv_, {}, "");
  if (!c) return last_fail(c.status().to_string());
  child_ = std::move(c.value());
  auto line = child_->read_line(o_.setup_timeout_s);
  if (!line) return last_fail("no ready line: " + line.status().to_string() + died());
  auto j = nlohmann::json::parse(line.value(), nullptr, false);
  if (j.is_discarded() || !j.value("ready", false))
    return last_fail(j.is_discarded() ? "bad ready line" : j.value("fatal", std::string("not ready")));
  ready_ = j;
  return Status::ok();
}

Result<nlohmann::json> ChildSession::evaluate(const std::string& id, const std::string& source, const nlohmann::json& launch,
                                                 const std::string& mode) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    KC_RETURN_IF_ERROR(ensure());
    nlohmann::json req = {{"id", id}, {"source", source}, {"launch", launch}, {"mode", mode}};
    if (!child_->write_line(req.dump())) {   // died after its last answer (device fault): restart
      reset();
      continue;
    }
    auto line = child_->read_line(o_.candidate_timeout_s);
    if (!line) {
      const bool hung = line.status().code() == Code::kTimeout;
      std::string why = hung ? "no answer within " + std::to_string(static_cast<int>(o_.candidate_timeout_s)) + " s (killed)"
                             : "the evaluation child died" + died();
      reset();
      return crash_verdict(hung ? "timeout" : "crash", why);
    }
    auto j = nlohmann::json::parse(line.value(), nullptr, false);
    if (j.is_discarded() || j.value("id", "") != id) {
      reset();
      return crash_verdict("crash", "garbled answer from the evaluation child");
    }
    starts_ = 0;
    // After a device fault the child exits once it has answered; start a fresh one next time
    // (writing to the dying one could blame the next candidate for its exit).
    if (j.value("context_lost", false)) reset();
    return j["verdict"];
  }
  return Status::error(Code::kUnavailable, "the evaluation child keeps dying before it reads a candidate");
}

nlohmann::json ChildSession::crash_verdict(const std::string& stage, const std::string& why) {
  return {{"verified", false}, {"stage", stage},
          {"stages", {{{"name", stage}, {"outcome", "rejected"}, {"summary", why}, {"evidence", nlohmann::json::object()}}}}};
}

std::string ChildSession::died() {
  if (!child_) return "";
  child_->kill_group();
  ProcessResult r = child_->wait(5);
  if (r.signal) return " (signal " + std::to_string(r.signal) + ": " + strsignal(r.signal) + ")";
  if (r.exited) return " (exit " + std::to_string(r.exit_code) + ")";
  return "";
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
