// Template renders are a contract with every cache already built: the same call and knobs must
// render the same bytes, or the search explores other kernels than the ones it resumed from and
// moving code around silently changes what is served. Every template's render for one call of each
// op it handles, at its default knobs and at every knob's last value, is hashed (BLAKE2b) and
// compared with tests/unit/data/template_digests.json. A deliberate change to a template rewrites
// that file: KC_WRITE_TEMPLATE_DIGESTS=1 kc_template_tests --gtest_filter=TemplateDigests.*
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "evolve/ops/op_call.h"
#include "evolve/propose/proposer.h"
#include "kernel_cache/bundle_trust.h"
#include "runtime/fsutil.h"
#include "tests/unit/plain_calls.h"

namespace kc::evolve {
namespace {

const std::string kDigestFile = std::string(KC_SOURCE_DIR) + "/tests/unit/data/template_digests.json";

std::string knob_text(const Knobs& k) {
  std::string s;
  for (const auto& [n, v] : k) s += (s.empty() ? "" : ",") + n + "=" + std::to_string(v);
  return s;
}

// Every (template, op, knob setting) render's digest: sources and launch specs.
nlohmann::json current_digests() {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& info : all_ops())
    for (BackendKind backend : {BackendKind::kCpu, BackendKind::kCuda}) {
      const PlainCall p = plain_call(info, 24, 96);
      auto c = make_call(info.id, p.sizes, DType::kF32, backend, p.args);
      if (!c) continue;
      for (const Template* t : templates_for(c.value())) {
        std::vector<KnobDim> space = t->space(c.value());
        Knobs first, last;
        for (const auto& d : space) {
          first[d.name] = d.values.front();
          last[d.name] = d.values.back();
        }
        for (const Knobs& k : {first, last}) {
          auto r = t->render(c.value(), k);
          const std::string id = std::string(t->name()) + "|" + info.name + "|" + knob_text(k);
          out[id] = r ? binary_hash(r.value().source + "\n" + r.value().launch.dump()) : "unsupported";
        }
      }
    }
  return out;
}

TEST(TemplateDigests, RendersAreByteIdenticalToTheRecordedOnes) {
  const nlohmann::json now = current_digests();
  ASSERT_GT(now.size(), 40u) << "every op has templates on both backends";
  if (std::getenv("KC_WRITE_TEMPLATE_DIGESTS")) {
    std::ofstream(kDigestFile) << now.dump(1) << "\n";
    GTEST_SKIP() << "wrote " << kDigestFile;
  }
  bool ok = false;
  const std::string text = read_file(kDigestFile, &ok);
  ASSERT_TRUE(ok) << "no " << kDigestFile;
  const nlohmann::json recorded = nlohmann::json::parse(text);
  for (const auto& [id, digest] : recorded.items()) {
    ASSERT_TRUE(now.contains(id)) << "no longer rendered: " << id;
    EXPECT_EQ(now[id], digest) << "render changed: " << id;
  }
  for (const auto& [id, digest] : now.items()) EXPECT_TRUE(recorded.contains(id)) << "not recorded: " << id;
}

}  // namespace
}  // namespace kc::evolve
