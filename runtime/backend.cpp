// Backend names and the one choice of implementation per kind.
#include "runtime/backend.h"

#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"

namespace kc {

const char* backend_name(BackendKind k) {
  switch (k) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
  }
  return "?";
}

std::optional<BackendKind> backend_from_name(std::string_view name) {
  for (BackendKind k : {BackendKind::kCpu, BackendKind::kCuda})
    if (name == backend_name(k)) return k;
  return std::nullopt;
}

Result<Backend*> backend_for(BackendKind kind, int device) {
  switch (kind) {
    case BackendKind::kCpu: return &cpu_backend();
    case BackendKind::kCuda: return cuda_backend(device);
  }
  return Status::error(Code::kInvalid, "backend kind");
}

}  // namespace kc
