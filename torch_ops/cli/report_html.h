// `kernelcraft report`'s page: one self-contained HTML file (inline CSS and SVG, one small inline
// script, the report's JSON embedded), readable from disk with no server and no network.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "torch_ops/cli/report_data.h"

namespace kc::cli {

std::string render_report_html(const Report& r);

// Text made safe for HTML element content and quoted attribute values (keys hold '|', knobs and
// evidence may hold '<' and quotes).
std::string html_escape(std::string_view s);
// JSON text safe inside <script type="application/json">: every '<' is written \u003c, so no
// "</script>" or "<!--" in the data can end or change the block (JSON.parse reads it back as '<').
std::string script_safe_json(const nlohmann::json& j);

// The page's number formats (its charts use them too): "12.35 µs", "1.235 ms", "2.10 s";
// "1.23x"; seconds "12.3 s"; "—" for an unknown (0) value.
std::string format_ms(double ms);
std::string format_speedup(double x);
std::string format_seconds(double s);

}  // namespace kc::cli
