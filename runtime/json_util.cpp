// Depth-bounded, non-throwing parsing; see json_util.h.
#include "runtime/json_util.h"

#include <exception>

namespace kc {
namespace {

using json = nlohmann::json;

// A SAX pass that only counts nesting: returning false from start_* makes nlohmann's reader stop
// right there, before it recurses any deeper.
struct DepthProbe : nlohmann::json_sax<json> {
  int depth = 0, max_depth;
  bool too_deep = false;
  explicit DepthProbe(int m) : max_depth(m) {}
  bool open() {
    if (++depth <= max_depth) return true;
    too_deep = true;
    return false;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

template <class Input>
Result<json> parse_bounded(Input bytes, json::input_format_t format, int max_depth) {
  try {
    DepthProbe probe(max_depth);
    const bool ok = json::sax_parse(bytes.begin(), bytes.end(), &probe, format, /*strict=*/true);
    if (probe.too_deep)
      return Status::error(Code::kCorrupt, "nested deeper than " + std::to_string(max_depth) + " levels");
    if (!ok) return Status::error(Code::kCorrupt, "does not parse");
    json j = format == json::input_format_t::cbor ? json::from_cbor(bytes.begin(), bytes.end(), true, false)
                                                  : json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (j.is_discarded()) return Status::error(Code::kCorrupt, "does not parse");
    return j;
  } catch (const std::exception& e) {   // bad_alloc on a huge declared length, and the like
    return Status::error(Code::kCorrupt, std::string("does not parse: ") + e.what());
  }
}

}  // namespace

Result<json> parse_cbor(std::string_view bytes, int max_depth) {
  return parse_bounded(bytes, json::input_format_t::cbor, max_depth);
}

Result<json> parse_json_text(std::string_view text, int max_depth) {
  return parse_bounded(text, json::input_format_t::json, max_depth);
}

}  // namespace kc
