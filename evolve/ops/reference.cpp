// The family table, torch half: each KC_FAMILY row of runtime/ops.def names its reference
// k<Family>Reference, defined in that family's <family>_reference.cpp.
#include "evolve/ops/reference.h"

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

}  // namespace kc::evolve
