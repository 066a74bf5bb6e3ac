// The family table, torch half: each KC_FAMILY row of runtime/ops.def names its reference
// k<Family>Reference, defined in that family's <family>_reference.cpp.
#include "evolve/ops/reference.h"

#include <algorithm>
#include <array>

namespace kc::evolve {

#define KC_FAMILY(f, name) extern const FamilyReference k##f##Reference;
#include "runtime/ops.def"
#undef KC_FAMILY

const FamilyReference& family_reference(OpFamily f) {
  static const std::array<const FamilyReference*, kNumFamilies> table = {
#define KC_FAMILY(f, name) &k##f##Reference,
#include "runtime/ops.def"
#undef KC_FAMILY
  };
  return *table[static_cast<int>(f)];
}

RowLayout dim_layout(const OpCall& c, const std::vector<at::Tensor>& in, size_t) {
  RowLayout l;
  l.model = true;
  const int64_t nd = in[0].dim();
  l.dim = c.int_arg("dim", -1);
  if (l.dim < 0) l.dim += nd;
  l.dim = nd == 0 ? 0 : std::clamp<int64_t>(l.dim, 0, nd - 1);
  l.k = nd == 0 ? 1 : std::max<int64_t>(1, in[0].size(l.dim));
  return l;
}

}  // namespace kc::evolve
