// The family table: each KC_FAMILY row of runtime/ops.def names its schema k<Family>Schema,
// defined in that family's home (<family>.cpp). A family without one does not link.
#include "evolve/ops/family.h"

#include <array>

namespace kc::evolve {

#define KC_FAMILY(f, name) extern const FamilySchema k##f##Schema;
#include "runtime/ops.def"
#undef KC_FAMILY

const FamilySchema& family_schema(OpFamily f) {
  static const std::array<const FamilySchema*, kNumFamilies> table = {
#define KC_FAMILY(f, name) &k##f##Schema,
#include "runtime/ops.def"
#undef KC_FAMILY
  };
  return *table[static_cast<int>(f)];
}

TensorMeta dense_meta(const std::string& name, std::vector<int64_t> sizes, DType dt) {
  TensorMeta m;
  m.name = name;
  m.dtype = dt;
  m.strides.resize(sizes.size());
  int64_t s = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    m.strides[i] = s;
    s *= sizes[i] > 1 ? sizes[i] : 1;
  }
  m.sizes = std::move(sizes);
  m.align = 16;
  return m;
}

TensorMeta absent_meta(const std::string& name) {
  TensorMeta m;
  m.name = name;
  m.defined = false;
  return m;
}

std::vector<int64_t> stat_sizes(const std::vector<int64_t>& sizes, size_t normalized) {
  std::vector<int64_t> stat(sizes.begin(), sizes.end() - static_cast<long>(normalized));
  stat.resize(sizes.size(), 1);
  return stat;
}

}  // namespace kc::evolve
