// Torch-free description of a tensor argument: what the key and the launch spec see of it.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <string>
#include <variant>
#include <vector>

namespace kc {

// Element types the runtime understands; names follow torch's short names.
enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI64, kI32, kI8, kU8, kBool, kOther };
const char* dtype_name(DType d);   // "f32", "f64", ...
std::optional<DType> dtype_from_name(std::string_view name);   // the inverse; nullopt if unknown
int dtype_size(DType d);           // bytes; 0 for kOther

struct TensorMeta {
  std::string name;                // schema argument name ("self", "weight") or "out0", ...
  bool defined = true;             // false for an absent optional tensor
  DType dtype = DType::kF32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;    // in elements
  int align = 16;                  // largest power of two (<= 16) dividing the data pointer
  int64_t numel() const;
  bool contiguous() const;
};

// A non-tensor argument: ints, doubles, bools, strings, int lists.
using ScalarValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;
struct ScalarArg {
  std::string name;
  ScalarValue value;
};

// Everything a launch spec may refer to: tensors (inputs first, then outputs) and scalars.
struct Binding {
  std::vector<TensorMeta> tensors;
  std::vector<ScalarArg> scalars;
  const TensorMeta* tensor(const std::string& name) const;
  const ScalarArg* scalar(const std::string& name) const;
};

// Alignment class of an address: 16, 8, 4, 2 or 1.
int align_class(const void* p);
// The largest alignment class (16): a pointer at 32 or 64 bytes counts as 16. Verification puts
// every buffer at an address of exactly its key's class (start = a multiple of kAlignSpan plus
// the class), so a kernel that assumes more alignment than its key gives fails there.
constexpr int kMaxAlignClass = 16;
constexpr int kAlignSpan = 2 * kMaxAlignClass;
// Bytes a tensor spans from its data pointer: (last reachable element + 1) * element size; 0
// for an absent or empty tensor.
int64_t extent_bytes(const TensorMeta& m);

}  // namespace kc
