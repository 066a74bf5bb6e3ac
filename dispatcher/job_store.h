// The client of a distributed job's own c10d store (torch's TCPStore at torchrun's MASTER_ADDR:
// MASTER_PORT, hosted by torchrun's agent), for job-wide coordination (dispatcher/coordinator.h).
// Nothing new is started: this process is one more client of the store the job already has, and
// every key it touches lies under kJobStorePrefix. Calls return typed results and never throw;
// each may block up to its timeout, so only a background thread calls them (never the hot path).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/status.h"

namespace kc::dispatch {

constexpr const char* kJobStorePrefix = "kernelcraft/v1";

struct JobStoreAddress {
  std::string host;
  int port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

// Where the job's store is, from `setting` (Config::job_store) and the environment: none (nullopt)
// for "off", and for "" unless WORLD_SIZE > 1 and MASTER_ADDR and MASTER_PORT are set (a single
// process, or a program not started as a distributed job); kInvalid for a malformed host:port.
Result<std::optional<JobStoreAddress>> job_store_address(const std::string& setting);

class JobStore {
 public:
  // Connects as a client (never hosts a store); kUnavailable when nothing answers within `timeout`,
  // which then also bounds every later call.
  static Result<std::unique_ptr<JobStore>> connect(const JobStoreAddress& a, std::chrono::milliseconds timeout);

  // kNotFound when absent; never waits for the key to appear (c10d's get would).
  Result<std::string> get(const std::string& key);
  Status set(const std::string& key, const std::string& value);
  // c10d's compareSet: `desired` is stored if the key holds `expected` ("" for an absent key);
  // returns what the key holds afterwards, so the caller won iff that equals `desired`.
  Result<std::string> compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  // Adds `delta` to a counter (created at 0) and returns the new value; delta 0 reads it.
  Result<int64_t> add(const std::string& key, int64_t delta);

 private:
  explicit JobStore(c10::intrusive_ptr<c10d::Store> s) : store_(std::move(s)) {}
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace kc::dispatch
