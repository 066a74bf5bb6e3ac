// The c10d store client; see job_store.h. Every c10d exception becomes a Status here.
#include "dispatcher/job_store.h"

#include <cstdlib>
#include <exception>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace kc::dispatch {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

Status failed(const std::string& what, const std::exception& e) {
  std::string m = e.what();
  return Status::error(Code::kUnavailable, "job store " + what + ": " + m.substr(0, m.find('\n')));
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

Result<int> parse_port(const std::string& s) {
  char* end = nullptr;
  long p = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || p < 1 || p > 65535) return Status::error(Code::kInvalid, "not a port: '" + s + "'");
  return static_cast<int>(p);
}

}  // namespace

Result<std::optional<JobStoreAddress>> job_store_address(const std::string& setting) {
  if (setting == "off") return std::optional<JobStoreAddress>();
  std::string host, port;
  if (setting.empty()) {
    const std::string ws = env("WORLD_SIZE");
    if (ws.empty() || std::atoi(ws.c_str()) <= 1) return std::optional<JobStoreAddress>();
    host = env("MASTER_ADDR");
    port = env("MASTER_PORT");
    if (host.empty() || port.empty()) return std::optional<JobStoreAddress>();
  } else {
    const size_t colon = setting.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return Status::error(Code::kInvalid, "job_store: '" + setting + "' is not off or host:port");
    host = setting.substr(0, colon);
    port = setting.substr(colon + 1);
  }
  auto p = parse_port(port);
  if (!p) return Status::error(Code::kInvalid, "job store port: " + p.status().message());
  return std::optional<JobStoreAddress>(JobStoreAddress{host, p.value()});
}

Result<std::unique_ptr<JobStore>> JobStore::connect(const JobStoreAddress& a, std::chrono::milliseconds timeout) {
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(a.port);
    o.isServer = false;        // the job's store already exists (torchrun's agent hosts it)
    o.waitWorkers = false;     // not one of the job's counted workers
    o.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(a.host, o);
    return std::unique_ptr<JobStore>(new JobStore(c10::make_intrusive<c10d::PrefixStore>(kJobStorePrefix, tcp)));
  } catch (const std::exception& e) {
    return failed("at " + a.to_string() + " unreachable", e);
  }
}

Result<std::string> JobStore::get(const std::string& key) {
  try {
    if (!store_->check({key})) return Status::error(Code::kNotFound, key);
    return text(store_->get(key));
  } catch (const std::exception& e) {
    return failed("get " + key, e);
  }
}

Status JobStore::set(const std::string& key, const std::string& value) {
  try {
    store_->set(key, bytes(value));
    return Status::ok();
  } catch (const std::exception& e) {
    return failed("set " + key, e);
  }
}

Result<std::string> JobStore::compare_set(const std::string& key, const std::string& expected,
                                          const std::string& desired) {
  try {
    return text(store_->compareSet(key, bytes(expected), bytes(desired)));
  } catch (const std::exception& e) {
    return failed("compareSet " + key, e);
  }
}

Result<int64_t> JobStore::add(const std::string& key, int64_t delta) {
  try {
    return store_->add(key, delta);
  } catch (const std::exception& e) {
    return failed("add " + key, e);
  }
}

}  // namespace kc::dispatch
