// The operator table's accessors; the rows are runtime/ops.def.
#include "runtime/ops.h"

namespace kc {

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> ops = {
#define KC_OP(id, name, fn, overload, family, on) {OpId::k##id, name, "aten::" #fn, overload, OpFamily::k##family, on},
#define KC_COMPOSITE(id, name, op, family, on) {OpId::k##id, name, op, "", OpFamily::k##family, on, true},
#include "runtime/ops.def"
#undef KC_COMPOSITE
#undef KC_OP
  };
  return ops;
}

const OpInfo& op_info(OpId id) { return all_ops()[static_cast<int>(id)]; }

std::optional<OpId> op_by_name(std::string_view name) {
  for (const auto& o : all_ops())
    if (name == o.name || name == o.aten) return o.id;
  return std::nullopt;
}

const char* family_name(OpFamily f) {
  switch (f) {
#define KC_FAMILY(f, name) \
  case OpFamily::k##f:     \
    return name;
#include "runtime/ops.def"
#undef KC_FAMILY
    case OpFamily::kCount: break;
  }
  return "?";
}

}  // namespace kc
