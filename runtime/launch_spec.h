// Launch specs: how a kernel's entry points are launched for one key. Shared by the CPU and CUDA
// backends; the format is documented in README.md ("Launch specs").
//
//   {"version": 1,
//    "launches": [{"entry": "kc_softmax", "grid": ["size(self,0)", 1, 1], "block": [256, 1, 1],
//                  "smem": "0", "args": ["ptr:out0", "ptr:self", "i64:size(self,-1)", "f32:eps"]}],
//    "scratch": [{"name": "partial", "bytes": "size(self,0) * 8"}]}
//
// grid/block/smem/scratch bytes are int expressions (runtime/expr.h) or plain integers. Each arg is
// "kind:what": ptr:<tensor or scratch name> (the data pointer), i32:/i64:<int expr>,
// f32:/f64:<float scalar name or literal>. Launches run in order on one stream.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"
#include "runtime/tensor_meta.h"

namespace kc {

struct LaunchSpec {
  struct Launch {
    std::string entry;
    std::string grid[3], block[3], smem;     // expressions
    std::vector<std::string> args;           // "kind:what"
  };
  struct Scratch {
    std::string name;
    std::string bytes;                       // expression
  };
  int version = 1;
  std::vector<Launch> launches;
  std::vector<Scratch> scratch;
};

Result<LaunchSpec> parse_launch_spec(const nlohmann::json& j);
nlohmann::json to_json(const LaunchSpec& s);

// One kernel parameter after resolution: a pointer slot or an immediate value.
struct Param {
  enum class Kind : uint8_t { kPtr, kI32, kI64, kF32, kF64 } kind;
  int slot = -1;           // kPtr: index into the per-call pointer table
  union { int32_t i32; int64_t i64; float f32; double f64; } imm{};
};

struct ResolvedLaunch {
  std::string entry;
  int64_t grid[3], block[3], smem;
  std::vector<Param> params;
};

// A spec bound to one key's metadata. Pointer table layout per call: the binding's tensors in
// order (tensors[i] -> slot i), then the scratch buffers (slot tensors.size() + j).
struct ResolvedSpec {
  std::vector<ResolvedLaunch> launches;
  std::vector<int64_t> scratch_bytes;
  int num_tensor_slots = 0;
  int num_slots() const { return num_tensor_slots + static_cast<int>(scratch_bytes.size()); }
};

// Evaluates every expression once (sizes are fixed by the key). Rejects negative or zero grid and
// block dimensions, unknown names, and pointer args naming absent tensors.
Result<ResolvedSpec> resolve(const LaunchSpec& spec, const Binding& b);

}  // namespace kc
