// The evaluation child's memory budget; see memory_cap.h.
#include "evolve/verify/memory_cap.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace kc::evolve {
namespace {

int64_t mem_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof(line), f))
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return static_cast<int64_t>(kb) * 1024;
}

int64_t meta_bytes(const TensorMeta& m) { return m.defined ? m.numel() * dtype_size(m.dtype) : 0; }

std::string mib(int64_t b) { return std::to_string(b >> 20) + " MiB"; }

}  // namespace

int64_t call_tensor_bytes(const OpCall& c) {
  int64_t b = 0;
  for (const auto& t : c.inputs) b += meta_bytes(t);
  for (const auto& t : c.outputs) b += meta_bytes(t);
  return b;
}

bool sets_resident(const OpCall& c, int64_t device_free) {
  const int64_t bytes = call_tensor_bytes(c);
  if (bytes <= kResidentMaxTensorBytes) return true;
  return c.backend == BackendKind::kCuda && device_free > 0 &&
         static_cast<double>(kResidentBytesPerTensorByte * bytes) <= kResidentDeviceShare * static_cast<double>(device_free);
}

int64_t eval_peak_estimate(const OpCall& c) {
  const int64_t per = sets_resident(c) ? kResidentBytesPerTensorByte : kStreamedBytesPerTensorByte;
  return per * call_tensor_bytes(c) + kEvalFixedBytes;
}

int64_t eval_memory_cap(double share) {
  if (share <= 0) return 0;
  return static_cast<int64_t>(share * static_cast<double>(mem_available()));
}

std::string memory_refusal(const OpCall& c, int64_t cap) {
  if (cap <= 0 || c.backend != BackendKind::kCpu) return "";
  const int64_t need = eval_peak_estimate(c);
  if (need <= cap) return "";
  return "skipped: the evaluation child would need about " + mib(need) + " (" + mib(call_tensor_bytes(c)) +
         " of tensors) and the memory cap is " + mib(cap) + " (evolve_memory_share of available memory)";
}

bool limit_address_space(int64_t cap) {
  if (cap <= 0) return true;
  struct rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) != 0) return false;
  const rlim_t want = static_cast<rlim_t>(cap + kAddressSpaceHeadroom);
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
  return setrlimit(RLIMIT_AS, &rl) == 0;
}

AddressSpaceLift::AddressSpaceLift() {
  struct rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == rl.rlim_max) return;
  cur_ = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  saved_ = setrlimit(RLIMIT_AS, &rl) == 0;
}

AddressSpaceLift::~AddressSpaceLift() {
  if (!saved_) return;
  struct rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) != 0) return;
  rl.rlim_cur = static_cast<rlim_t>(cur_);
  setrlimit(RLIMIT_AS, &rl);
}

}  // namespace kc::evolve
