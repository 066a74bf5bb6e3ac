// Template registry and candidate identity.
#include "evolve/propose/proposer.h"

namespace kc::evolve {

std::string Candidate::id() const {
  std::string s = family + "{";
  bool first = true;
  for (const auto& [k, v] : knobs) {
    if (!first) s += ",";
    first = false;
    s += k + "=" + std::to_string(v);
  }
  return s + "}";
}

const std::vector<const Template*>& all_templates() {
  static const std::vector<const Template*> all = [] {
    std::vector<const Template*> v = cuda_templates();
    const auto& c = cpu_templates();
    v.insert(v.end(), c.begin(), c.end());
    const auto& p = planted_templates();
    v.insert(v.end(), p.begin(), p.end());
    return v;
  }();
  return all;
}

std::vector<const Template*> templates_for(const OpCall& c) {
  std::vector<const Template*> out;
  for (const Template* t : all_templates())
    if (c.backend == t->backend() && !t->space(c).empty()) out.push_back(t);
  return out;
}

}  // namespace kc::evolve
