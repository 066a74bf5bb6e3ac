// Scans (cumsum, cumprod, logcumsumexp), schema half: an inclusive scan along one axis, `dim`.
#include "evolve/ops/family.h"

namespace kc::evolve {
namespace {

Status make_scan(OpId op, const std::vector<int64_t>& sizes, DType dt, const nlohmann::json& args, OpCall& c) {
  c.inputs = {dense_meta("self", sizes, dt)};
  c.scalars = {{"dim", args.value("dim", int64_t{-1})}};
  // cumsum and cumprod take an optional output dtype; absent is the string "none" (key.h).
  if (op != OpId::kLogcumsumexp) c.scalars.push_back({"dtype", args.value("dtype", std::string("none"))});
  return Status::ok();
}

// The output has the input's sizes and dtype (or the requested dtype).
Result<std::vector<TensorMeta>> scan_outputs(const OpCall& c) {
  const TensorMeta& x = c.inputs[0];
  const int64_t nd = static_cast<int64_t>(x.sizes.size());
  const int64_t dim = c.int_arg("dim", -1);
  if (dim < -std::max<int64_t>(nd, 1) || dim >= std::max<int64_t>(nd, 1)) return Status::error(Code::kInvalid, "dim");
  DType dt = x.dtype;
  const std::string want = c.string_arg("dtype", "none");
  if (want != "none") {
    auto d = dtype_from_name(want);
    if (!d) return Status::error(Code::kUnsupported, "dtype " + want);
    dt = *d;
  }
  return std::vector<TensorMeta>{dense_meta("out0", x.sizes, dt)};
}

}  // namespace

extern const FamilySchema kScanSchema{&make_scan, &scan_outputs};

}  // namespace kc::evolve
