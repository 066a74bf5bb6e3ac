// The evaluation child's memory budget. The child builds several reference input sets at once
// (captured, normal, large, offset, extreme, special: inputs, eager and fp64 outputs, masks) and
// allocates outputs and comparison temporaries per candidate, so its peak is a multiple of the
// key's tensor bytes (the factors below, measured: docs/PERF.md "Evaluation memory"). A key whose estimate
// exceeds the cap is skipped before a child is started; a CPU child also runs under RLIMIT_AS =
// the cap plus kAddressSpaceHeadroom, so an estimate that was too low ends in a failed allocation
// in that child, not in the host running out of memory. CUDA children get no RLIMIT_AS: the driver
// reserves far more virtual address space than it uses, and their tensors live on the device.
#pragma once
#include <cstdint>
#include <string>

#include "evolve/ops/op_call.h"

namespace kc::evolve {

// Keys with at most this many tensor bytes keep every input set resident (built once, reused by
// every candidate: fast searches, peak about kResidentBytesPerTensorByte x the tensors); larger
// keys rebuild one set at a time per candidate (peak about kStreamedBytesPerTensorByte x).
constexpr int64_t kResidentMaxTensorBytes = int64_t{8} << 20;
// Each set also keeps a float32 tolerance per output (evolve/verify/numerics.h attach_tolerance): +6 for
// resident sets; streamed, measured +3 (a 144 MiB layer-norm key: 1072 -> 1508 MiB peak RSS).
constexpr int64_t kResidentBytesPerTensorByte = 54;
constexpr int64_t kStreamedBytesPerTensorByte = 9;
constexpr int64_t kEvalFixedBytes = int64_t{1} << 30;          // torch, the compiler, one candidate's .so
constexpr int64_t kAddressSpaceHeadroom = int64_t{8} << 30;    // libraries, thread stacks, arenas: virtual

// Bytes of the call's inputs and outputs (one of each).
int64_t call_tensor_bytes(const OpCall& c);
// A CUDA key keeps its sets resident also where the resident estimate fits this share of the
// device's free memory when its gauntlet starts: on a 141 GB H200, keys up to about 600 MB of
// tensors, the size class of single-op benchmarks, where rebuilding every set and its fp64
// references for each candidate took most of a search (a 3 GiB key: one candidate in 22 s). A
// quarter, since the user's job shares the GPU while evolution runs in the background.
constexpr double kResidentDeviceShare = 0.25;

// True when the call's input sets stay resident in the evaluation child (see above); device_free:
// the CUDA device's free bytes (0: unknown, the host rule alone).
bool sets_resident(const OpCall& c, int64_t device_free = 0);
// What the child is expected to hold at its peak for this call.
int64_t eval_peak_estimate(const OpCall& c);
// share x MemAvailable (/proc/meminfo); 0 when share <= 0 or unknown (no cap).
int64_t eval_memory_cap(double share);
// "" if the call fits in `cap` (0: no cap), else the reason it is skipped.
std::string memory_refusal(const OpCall& c, int64_t cap);
// Applies RLIMIT_AS = cap + headroom to this process (the CPU evaluation child, at its start), as
// the soft limit: the hard one stays, so that AddressSpaceLift can lift it for a sanitizer run.
bool limit_address_space(int64_t cap);

// While alive, this process's RLIMIT_AS soft limit is its hard limit. AddressSanitizer reserves
// terabytes of shadow address space at start and cannot run under the cap (every CPU candidate was
// refused at the sanitizer stage when its runner inherited it); its runner is started inside one.
class AddressSpaceLift {
 public:
  AddressSpaceLift();
  ~AddressSpaceLift();
  AddressSpaceLift(const AddressSpaceLift&) = delete;
  AddressSpaceLift& operator=(const AddressSpaceLift&) = delete;

 private:
  bool saved_ = false;
  unsigned long long cur_ = 0;
};

}  // namespace kc::evolve
