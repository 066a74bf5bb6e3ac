// The sandboxed child's broker (broker.h): the wire format, the broker's loop, the child's side.
// A message is a JSON header frame followed by header["blobs"] byte frames (sources, binaries and
// inputs are bytes, not JSON strings); a frame is a 64-bit length and the bytes.
#include "evolve/verify/broker.h"

#include "evolve/verify/preprocess.h"
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "evolve/verify/preprocess.h"
#include "runtime/cpu_backend.h"

namespace kc::evolve {
namespace {

constexpr uint64_t kMaxFrame = uint64_t{8} << 30;

bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);   // a dead peer is an error here, never SIGPIPE
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_frame(int fd, std::string_view s) {
  const uint64_t n = s.size();
  return send_all(fd, &n, sizeof n) && send_all(fd, s.data(), s.size());
}

bool recv_frame(int fd, std::string& out) {
  uint64_t n = 0;
  if (!recv_all(fd, &n, sizeof n) || n > kMaxFrame) return false;
  out.resize(n);
  return n == 0 || recv_all(fd, out.data(), n);
}

struct Message {
  nlohmann::json head;
  std::vector<std::string> blobs;
};

bool send_message(int fd, nlohmann::json head, const std::vector<const std::string*>& blobs) {
  head["blobs"] = blobs.size();
  if (!send_frame(fd, head.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))) return false;
  for (const std::string* b : blobs)
    if (!send_frame(fd, *b)) return false;
  return true;
}

std::optional<Message> recv_message(int fd) {
  Message m;
  std::string head;
  if (!recv_frame(fd, head)) return std::nullopt;
  m.head = nlohmann::json::parse(head, nullptr, false);
  if (m.head.is_discarded() || !m.head.is_object() || !m.head["blobs"].is_number_unsigned()) return std::nullopt;
  const uint64_t n = m.head["blobs"].get<uint64_t>();
  if (n > 4096) return std::nullopt;
  m.blobs.resize(n);
  for (auto& b : m.blobs)
    if (!recv_frame(fd, b)) return std::nullopt;
  return m;
}


int thread_count() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

nlohmann::json serve_one(const Message& m, const GauntletOptions& o, std::string& binary) {
  const std::string op = m.head.value("op", "");
  nlohmann::json reply = {{"seq", m.head.value("seq", uint64_t{0})}};
  if (op == "compile" && m.blobs.size() == 1) {
    auto out = cpu_compile(m.blobs[0], {});
    if (!out) {
      reply["ok"] = false;
      reply["code"] = static_cast<int>(out.status().code());
      reply["message"] = out.status().message();
      return reply;
    }
    reply["ok"] = true;
    reply["log"] = out.value().log;
    reply["millis"] = out.value().millis;
    binary = std::move(out.value().binary);
    return reply;
  }
  if (op == "preprocess" && m.blobs.size() == 1) {
    auto out = expand_macros(m.blobs[0]);
    reply["ok"] = static_cast<bool>(out);
    if (!out) {
      reply["code"] = static_cast<int>(out.status().code());
      reply["message"] = out.status().message();
      return reply;
    }
    binary = std::move(out.value());
    return reply;
  }
  if (op == "sanitize" && m.blobs.size() >= 2) {
    SanitizerRun run;
    run.backend = backend_from_name(m.head.value("backend", "")).value_or(BackendKind::kCpu);
    run.device = m.head.value("device", 0);
    run.call = m.head.value("call", nlohmann::json::object());
    run.launch = m.head.value("launch", nlohmann::json::object());
    run.source = m.blobs[0];
    run.binary = m.blobs[1];
    run.inputs.assign(m.blobs.begin() + 2, m.blobs.end());
    reply["ok"] = true;
    reply["stage"] = run_sanitizers(run, o).to_json();
    return reply;
  }
  reply["ok"] = false;
  reply["code"] = static_cast<int>(Code::kInvalid);
  reply["message"] = "the broker does not know this request";
  return reply;
}

// The broker's whole life: never returns into the child's code (nor runs its exit handlers).
[[noreturn]] void serve(int fd, const GauntletOptions& o, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  // The child's stdin and stdout are the worker's protocol pipes: not the broker's to touch, and
  // holding them open would hide the child's death from the worker.
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
    close(null);
  }
  for (;;) {
    auto m = recv_message(fd);
    if (!m) _exit(0);
    std::string binary;
    nlohmann::json reply = serve_one(*m, o, binary);
    std::vector<const std::string*> blobs;
    if (!binary.empty()) blobs.push_back(&binary);
    if (!send_message(fd, std::move(reply), blobs)) _exit(0);
  }
}

}  // namespace

Result<std::unique_ptr<Broker>> Broker::start(const GauntletOptions& o) {
  if (int n = thread_count(); n > 1)   // -1: no /proc to count with; nothing to go by
    return Status::error(Code::kUnavailable, "the sandbox broker must be forked by a single-threaded process; this one has " +
                                                 std::to_string(n) + " threads");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return Status::error(Code::kUnavailable, std::string("socketpair: ") + std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return Status::error(Code::kUnavailable, std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    close(sv[0]);
    serve(sv[1], o, parent);
  }
  close(sv[1]);
  return std::unique_ptr<Broker>(new Broker(sv[0], pid));
}

Broker::~Broker() {
  if (fd_ >= 0) close(fd_);   // the broker sees the end of its requests and exits
  // A sandboxed child may not signal the broker; it goes by itself (or with this process).
  for (int i = 0; i < 200 && pid_ > 0; ++i) {
    int st = 0;
    pid_t w = waitpid(pid_, &st, WNOHANG);
    if (w == pid_ || (w < 0 && errno != EINTR)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Result<std::string> Broker::preprocess(const std::string& source) {
  if (broken_) return Status::error(Code::kUnavailable, "the sandbox broker is gone");
  const uint64_t seq = ++seq_;
  std::optional<Message> m;
  if (send_message(fd_, {{"op", "preprocess"}, {"seq", seq}}, {&source})) m = recv_message(fd_);
  if (!m || m->head.value("seq", uint64_t{0}) != seq) {
    broken_ = true;
    return Status::error(Code::kUnavailable, "the sandbox broker did not answer the preprocess request");
  }
  if (!m->head.value("ok", false)) {
    int code = m->head.value("code", static_cast<int>(Code::kUnavailable));
    if (code <= 0 || code > static_cast<int>(Code::kRejected)) code = static_cast<int>(Code::kUnavailable);
    return Status::error(static_cast<Code>(code), m->head.value("message", std::string("preprocess failed")));
  }
  if (m->blobs.size() != 1) {
    broken_ = true;
    return Status::error(Code::kUnavailable, "the sandbox broker sent no text");
  }
  return std::move(m->blobs[0]);
}

Result<CompileOutput> Broker::compile(const std::string& source) {
  if (broken_) return Status::error(Code::kUnavailable, "the sandbox broker is gone");
  const uint64_t seq = ++seq_;
  std::optional<Message> m;
  if (send_message(fd_, {{"op", "compile"}, {"seq", seq}}, {&source})) m = recv_message(fd_);
  if (!m || m->head.value("seq", uint64_t{0}) != seq) {
    broken_ = true;
    return Status::error(Code::kUnavailable, "the sandbox broker did not answer the compile request");
  }
  if (!m->head.value("ok", false)) {
    int code = m->head.value("code", static_cast<int>(Code::kUnavailable));
    if (code <= 0 || code > static_cast<int>(Code::kRejected)) code = static_cast<int>(Code::kUnavailable);
    return Status::error(static_cast<Code>(code), m->head.value("message", std::string("compile failed")));
  }
  if (m->blobs.size() != 1) {
    broken_ = true;
    return Status::error(Code::kUnavailable, "the sandbox broker sent no binary");
  }
  CompileOutput out;
  out.binary = std::move(m->blobs[0]);
  out.log = m->head.value("log", "");
  out.millis = m->head.value("millis", 0.0);
  return out;
}

StageReport Broker::sanitize(const SanitizerRun& run) {
  auto lost = [](const std::string& why) {
    return StageReport{StageId::kSanitizer, Outcome::kRejected, why, nlohmann::json::object(), 0};
  };
  if (broken_) return lost("the sandbox broker is gone");
  const uint64_t seq = ++seq_;
  nlohmann::json head = {{"op", "sanitize"}, {"seq", seq}, {"backend", backend_name(run.backend)}, {"device", run.device},
                         {"call", run.call}, {"launch", run.launch}};
  std::vector<const std::string*> blobs = {&run.source, &run.binary};
  for (const auto& in : run.inputs) blobs.push_back(&in);
  std::optional<Message> m;
  if (send_message(fd_, head, blobs)) m = recv_message(fd_);
  if (!m || m->head.value("seq", uint64_t{0}) != seq || !m->head.contains("stage")) {
    broken_ = true;
    return lost("the sandbox broker did not answer the sanitizer request");
  }
  return StageReport::from_json(m->head["stage"], StageId::kSanitizer);
}

}  // namespace kc::evolve
