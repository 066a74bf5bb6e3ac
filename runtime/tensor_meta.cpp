// TensorMeta helpers.
#include "runtime/tensor_meta.h"

namespace kc {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kBool: return "b8";
    case DType::kOther: return "other";
  }
  return "other";
}

int dtype_size(DType d) {
  switch (d) {
    case DType::kF64: case DType::kI64: return 8;
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
    case DType::kOther: return 0;
  }
  return 0;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kI8,
                  DType::kU8, DType::kBool})
    if (name == dtype_name(d)) return d;
  return std::nullopt;
}

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

bool TensorMeta::contiguous() const {
  int64_t expect = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    if (sizes[i] != 1 && strides[i] != expect) return false;
    expect *= sizes[i];
  }
  return true;
}

const TensorMeta* Binding::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const ScalarArg* Binding::scalar(const std::string& name) const {
  for (const auto& s : scalars)
    if (s.name == name) return &s;
  return nullptr;
}

int64_t extent_bytes(const TensorMeta& m) {
  if (!m.defined) return 0;
  int64_t last = 0;
  for (size_t d = 0; d < m.sizes.size(); ++d) {
    if (m.sizes[d] == 0) return 0;
    last += (m.sizes[d] - 1) * m.strides[d];
  }
  return (last + 1) * static_cast<int64_t>(dtype_size(m.dtype));
}

int align_class(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  if (a % 16 == 0) return 16;
  if (a % 8 == 0) return 8;
  if (a % 4 == 0) return 4;
  if (a % 2 == 0) return 2;
  return 1;
}

}  // namespace kc
