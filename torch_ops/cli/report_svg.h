// The report page's charts, drawn server-side as inline SVG (no script, no library): each returns
// one <svg> element, or "" when there is nothing to draw.
#pragma once
#include <string>
#include <vector>

#include "torch_ops/cli/report_data.h"

namespace kc::cli {

// Best verified time per generation (and best so far), against eager's time as a dashed line.
std::string svg_search_curve(const KeyReport& k);
// Speedup over eager per key with a measured speedup, on a log scale around 1x.
std::string svg_speedups(const std::vector<KeyReport>& keys);
// Per operator, where the time went: search, verification, sanitizers (stacked bars).
std::string svg_time_by_op(const std::vector<Totals>& ops);

}  // namespace kc::cli
