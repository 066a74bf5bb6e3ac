// The report page (report_html.h). Everything is rendered here; the inline script only checks
// that the embedded data matches the rendered rows, adds a filter box, and marks the page
// rendered (the headless-browser test reads that mark and the error list).
#include "torch_ops/cli/report_html.h"

#include <cstdio>

#include "torch_ops/cli/report_svg.h"

namespace kc::cli {
namespace {

using nlohmann::json;

constexpr size_t kMaxEvidenceChars = 20000;   // per stage; --json and the embedded data keep it whole

const char kStyle[] = R"CSS(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1180px;padding:16px;color:#222}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:0 0 6px}code,pre{font:12px/1.35 ui-monospace,Menlo,Consolas,monospace}
pre{background:#f6f6f6;padding:6px;overflow:auto;max-height:320px;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#fafafa;font-weight:600}td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
.muted{color:#777}.key{border:1px solid #ddd;border-radius:6px;padding:10px 12px;margin:12px 0}
.call{word-break:break-all}.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;color:#fff;background:#888}
.served{background:#2e7d32}.eager_best{background:#607d8b}.disabled{background:#c62828}.unverified{background:#ef6c00}
.searching,.search_ended{background:#1565c0}.corrupt{background:#6a1b9a}.passed{color:#2e7d32}.rejected{color:#c62828}
.skipped{color:#777}svg text{font:11px system-ui,sans-serif;fill:#333}svg .axis{fill:#555}svg .plot{fill:#fcfcfc;stroke:#ccc}
svg .best{fill:none;stroke:#4e79a7;stroke-width:2}svg .gen{fill:#4e79a7}svg .eager{stroke:#c62828;stroke-dasharray:5 4}
svg .grid{stroke:#eee}svg .one{stroke:#999}svg .faster{fill:#59a14f}svg .slower{fill:#bbb}
.row{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}#kc-errors:empty{display:none}
#kc-errors{color:#fff;background:#c62828;padding:6px}input#filter{width:360px;padding:4px}
)CSS";

// Records script errors into the page itself, where the headless test (and a reader) sees them.
const char kErrorScript[] = R"JS(
window.onerror=function(m,src,line){var e=document.getElementById('kc-errors');
e.textContent+='script error: '+m+' (line '+line+')\n';document.body.dataset.rendered='error';};
)JS";

// The embedded data must describe exactly the rendered keys; then the filter box, then the mark.
const char kMainScript[] = R"JS(
(function(){
var data=JSON.parse(document.getElementById('kc-data').textContent);
var rows=document.querySelectorAll('tr.keyrow'),secs=document.querySelectorAll('section.key');
if(rows.length!==data.keys.length||secs.length!==data.keys.length)
  throw new Error('page shows '+rows.length+' keys, data has '+data.keys.length);
data.keys.forEach(function(k,i){if(rows[i].dataset.key!==k.key)throw new Error('key '+i+' differs');});
var f=document.getElementById('filter');
f.addEventListener('input',function(){var t=f.value.toLowerCase();
  [rows,secs].forEach(function(list){list.forEach(function(el){
    el.hidden=t!==''&&el.dataset.key.toLowerCase().indexOf(t)<0&&el.dataset.state.indexOf(t)<0;});});});
if(document.body.dataset.rendered!=='error')document.body.dataset.rendered='ok';
})();
)JS";

std::string esc(const std::string& s) { return html_escape(s); }
std::string td(const std::string& s) { return "<td>" + esc(s) + "</td>"; }
std::string tdn(const std::string& s) { return "<td class=\"n\">" + esc(s) + "</td>"; }
std::string badge(KeyState s) {
  return std::string("<span class=\"badge ") + key_state_name(s) + "\">" + key_state_name(s) + "</span>";
}
std::string count(double v) { return v > 0 ? std::to_string(static_cast<long long>(v)) : "—"; }
std::string gbs(double v) {
  if (v <= 0) return "—";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GB/s", v);
  return b;
}
std::string bytes_text(double b) {
  if (b <= 0) return "—";
  char s[32];
  if (b >= 1 << 20) std::snprintf(s, sizeof s, "%.2f MiB", b / (1 << 20));
  else std::snprintf(s, sizeof s, "%.1f KiB", b / 1024);
  return s;
}

// The key after its target and op: the policy and the arguments, which say what the call is.
std::string call_of(const std::string& key) {
  size_t p = 0;
  for (int bar = 0; bar < 3 && p != std::string::npos; ++bar) p = key.find('|', p + 1);
  return p == std::string::npos ? key : key.substr(p + 1);
}

std::string states_text(const Totals& t) {
  std::string out;
  for (const auto& [s, n] : t.by_state) out += (out.empty() ? "" : ", ") + std::to_string(n) + " " + key_state_name(s);
  return out.empty() ? "none" : out;
}

std::string totals_row(const Totals& t, const std::string& name) {
  return "<tr>" + td(name) + tdn(std::to_string(t.keys)) + td(states_text(t)) + tdn(std::to_string(t.evaluated)) +
         tdn(format_speedup(t.best_speedup)) + tdn(format_speedup(t.geomean_speedup)) +
         tdn(format_seconds(t.time.search_s)) + tdn(format_seconds(t.time.verification_s)) +
         tdn(format_seconds(t.time.sanitizer_s)) + tdn(format_seconds(t.time.total())) + "</tr>";
}

std::string summary_html(const Report& r) {
  std::string s = "<h2 id=\"summary\">Per operator and cache</h2><table><thead><tr><th>operator</th><th>keys</th>"
                  "<th>states</th><th>evaluated</th><th>best speedup</th><th>geomean (served)</th><th>search</th>"
                  "<th>verification</th><th>sanitizers</th><th>total</th></tr></thead><tbody>";
  for (const auto& o : r.ops) s += totals_row(o, o.op);
  s += "</tbody><tfoot>" + totals_row(r.cache, "whole cache") + "</tfoot></table>";
  s += "<p class=\"muted\">Search: the search's wall clock (candidates through the search-mode gauntlet, compiles "
       "included). Verification and sanitizers: the full-gauntlet run each record keeps; runs of refused "
       "promotions are not timed in the cache.</p>";
  if (std::string t = svg_time_by_op(r.ops); !t.empty()) s += "<h3>Where the time went</h3><div class=\"row\">" + t + "</div>";
  if (std::string sp = svg_speedups(r.keys); !sp.empty())
    s += "<h3>Speedup over eager</h3><div class=\"row\">" + sp + "</div>";
  return s;
}

// Only a stored kernel's speedup is one the cache serves; an eager_best key's is its best
// candidate's search timing, shown apart so that it is not read as a gain.
std::string speedup_cell(const KeyReport& k) {
  if (k.state != KeyState::kEagerBest || k.speedup <= 0) return tdn(format_speedup(k.speedup));
  return "<td class=\"n muted\" title=\"best candidate's search timing; eager is kept\">" +
         esc(format_speedup(k.speedup)) + "</td>";
}

std::string key_row(const KeyReport& k, size_t i) {
  return "<tr class=\"keyrow\" data-key=\"" + esc(k.key) + "\" data-state=\"" + key_state_name(k.state) + "\">" +
         "<td class=\"n\"><a href=\"#key-" + std::to_string(i + 1) + "\">#" + std::to_string(i + 1) + "</a></td><td>" +
         badge(k.state) + "</td>" + td(k.op) + "<td class=\"call\"><code>" + esc(call_of(k.key)) + "</code></td>" +
         speedup_cell(k) + tdn(format_ms(k.median_ms)) + tdn(format_ms(k.eager_ms)) +
         tdn(gbs(gb_per_s(k.bytes, k.median_ms))) + tdn(count(k.generations)) + tdn(count(k.evaluated)) + "</tr>";
}

std::string keys_table(const Report& r) {
  std::string s = "<h2 id=\"keys\">Keys</h2><p><input id=\"filter\" type=\"search\" placeholder=\"filter by key text "
                  "or state\" aria-label=\"filter keys\"></p><table><thead><tr><th>#</th><th>state</th><th>operator"
                  "</th><th>call</th><th>speedup</th><th>kernel</th><th>eager</th><th>bandwidth</th><th>generations"
                  "</th><th>evaluated</th></tr></thead><tbody>";
  for (size_t i = 0; i < r.keys.size(); ++i) s += key_row(r.keys[i], i);
  return s + "</tbody></table>";
}

std::string fact(const std::string& name, const std::string& value) {
  return "<tr><th>" + esc(name) + "</th>" + td(value) + "</tr>";
}

std::string facts_html(const KeyReport& k, const PeakBandwidth& peak) {
  const double g = gb_per_s(k.bytes, k.median_ms);
  std::string bw = gbs(g);
  if (g > 0) bw += peak.measured ? " (" + std::to_string(static_cast<int>(100 * g / peak.gb_per_s)) + "% of peak)"
                                 : " (peak not measured)";
  std::string s = "<table>" + fact(k.state == KeyState::kEagerBest ? "best candidate over eager (not served)"
                                                                    : "speedup over eager",
                                   format_speedup(k.speedup));
  if (k.speedup_p10 > 0) s += fact("speedup, 10th percentile of pairs", format_speedup(k.speedup_p10));
  if (k.pairs > 0) s += fact("interleaved pairs", std::to_string(k.pairs));
  s += fact(k.state == KeyState::kEagerBest ? "best candidate (search timing)" : "kernel median", format_ms(k.median_ms));
  s += fact("eager median", format_ms(k.eager_ms)) + fact("bytes moved (least: inputs + outputs once)", bytes_text(k.bytes));
  s += fact("achieved bandwidth", bw) + fact("eager bandwidth", gbs(gb_per_s(k.bytes, k.eager_ms)));
  s += fact("determinism", determinism_name(k.determinism));
  s += fact("recorded by", k.provenance_by + (k.recorded_at.empty() ? "" : ", " + k.recorded_at));
  s += fact("time: search / verification / sanitizers", format_seconds(k.time.search_s) + " / " +
            format_seconds(k.time.verification_s) + " / " + format_seconds(k.time.sanitizer_s));
  return s + "</table>";
}

std::string lineage_html(const KeyReport& k) {
  if (!k.lineage) return "<p class=\"muted\">No candidate lineage (a hand-made record, or no kernel stored).</p>";
  const Lineage& l = *k.lineage;
  std::string parents;
  for (const auto& p : l.parents) parents += (parents.empty() ? "" : ", ") + p;
  return "<h3>Lineage</h3><table>" + fact("candidate", l.id) + fact("family", l.family) + fact("origin", l.origin) +
         fact("generation", std::to_string(l.generation)) + fact("parents", parents.empty() ? "none (a seed)" : parents) +
         fact("knobs", l.knobs.dump(-1, ' ', false, json::error_handler_t::replace)) + "</table>";
}

// Promotions the full gauntlet refused: a stage that rejected, or (no stage) the interleaved
// timing that did not show the gain.
std::string refused_html(const json& refused) {
  if (!refused.is_array() || refused.empty()) return "";
  std::string s = "<details><summary>" + std::to_string(refused.size()) + " promotion(s) refused</summary><table>"
                  "<thead><tr><th>candidate</th><th>refused at</th><th>kernel</th><th>eager</th></tr></thead><tbody>";
  for (const auto& r : refused) {
    if (!r.is_object()) continue;
    const auto str = [&](const char* f) { return r.contains(f) && r[f].is_string() ? r[f].get<std::string>() : ""; };
    const auto ms = [&](const char* f) { return r.contains(f) && r[f].is_number() ? r[f].get<double>() : 0.0; };
    const std::string stage = str("stage").empty() ? "timing (no clear gain)" : str("stage");
    s += "<tr>" + td(str("id")) + td(stage) + tdn(format_ms(ms("median_ms"))) + tdn(format_ms(ms("eager_median_ms"))) +
         "</tr>";
  }
  return s + "</tbody></table></details>";
}

std::string search_html(const KeyReport& k) {
  if (!k.has_search) return "<p class=\"muted\">No search recorded for this key.</p>";
  std::string s = "<h3>Search</h3><p>" + std::to_string(k.generations) + " generation(s), " +
                  std::to_string(k.evaluated) + " candidates" +
                  (k.finish_reason.empty() ? std::string() : ", ended by " + esc(k.finish_reason));
  if (k.first_verified_s > 0) s += "; first verified after " + format_seconds(k.first_verified_s);
  if (k.best_found_s > 0) s += ", the best after " + format_seconds(k.best_found_s);
  s += ".</p>";
  std::string curve = svg_search_curve(k);
  s += curve.empty() ? "<p class=\"muted\">No per-generation history in the cache (search state absent, or nothing "
                       "passed).</p>" : curve;
  return s + refused_html(k.refused);
}

std::string evidence_html(const json& ev) {
  if (!ev.is_object() || ev.empty()) return "";
  std::string text = ev.dump(2, ' ', false, json::error_handler_t::replace);
  std::string note;
  if (text.size() > kMaxEvidenceChars) {
    note = "\n… " + std::to_string(text.size() - kMaxEvidenceChars) + " more characters in report --json";
    text.resize(kMaxEvidenceChars);
  }
  return "<details><summary>evidence</summary><pre>" + esc(text + note) + "</pre></details>";
}

std::string stages_html(const KeyReport& k) {
  if (k.stages.empty()) return "<p class=\"muted\">No gauntlet run stored with this record.</p>";
  std::string s = "<h3>Gauntlet</h3><table><thead><tr><th>stage</th><th>outcome</th><th>time</th><th>summary and "
                  "evidence</th></tr></thead><tbody>";
  for (const auto& st : k.stages) {
    const std::string outcome = evolve::outcome_name(st.outcome);
    s += "<tr>" + td(evolve::stage_name(st.id)) + "<td class=\"" + outcome + "\">" + outcome + "</td>" +
         tdn(format_ms(st.millis)) + "<td>" + esc(st.summary) + evidence_html(st.evidence) + "</td></tr>";
  }
  return s + "</tbody></table>";
}

std::string key_section(const KeyReport& k, size_t i, const PeakBandwidth& peak) {
  std::string s = "<section class=\"key\" id=\"key-" + std::to_string(i + 1) + "\" data-key=\"" + esc(k.key) +
                  "\" data-state=\"" + key_state_name(k.state) + "\"><h3>#" + std::to_string(i + 1) + " " + esc(k.op) +
                  " " + badge(k.state) + "</h3><p class=\"call\"><code>" + esc(k.key) + "</code></p>";
  if (!k.error.empty()) s += "<p class=\"rejected\">" + esc(k.error) + "</p>";
  s += "<div class=\"row\"><div>" + facts_html(k, peak) + lineage_html(k) + "</div><div>" + search_html(k) + "</div></div>";
  s += stages_html(k);
  if (!k.disabled.empty())
    s += "<h3>Disabled by the live check</h3><pre>" +
         esc(k.disabled.dump(2, ' ', false, json::error_handler_t::replace)) + "</pre>";
  return s + "</section>";
}

std::string header_html(const Report& r) {
  std::string s = "<h1>kernelcraft report</h1><p>cache <code>" + esc(r.cache_dir) + "</code> · generated " +
                  esc(r.generated_at) + " · " + std::to_string(r.keys.size()) + " key(s)</p><p class=\"muted\">" +
                  esc(r.peak_note) + "</p>";
  for (const auto& [target, p] : r.peaks)
    s += "<p>peak of <code>" + esc(target) + "</code>: " + gbs(p.gb_per_s) + " (copy, median of " +
         std::to_string(p.samples) + " record(s))</p>";
  if (r.damaged_regions)
    s += "<p class=\"rejected\">" + std::to_string(r.damaged_regions) +
         " damaged region(s) of the cache could not be read (kernelcraft cache repair salvages what is left).</p>";
  return s;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string script_safe_json(const nlohmann::json& j) {
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<') out += "\\u003c";   // only inside JSON strings, where the escape means the same
    else out += c;
  }
  return out;
}

std::string format_ms(double ms) {
  if (!(ms > 0)) return "—";
  char b[32];
  if (ms < 1) std::snprintf(b, sizeof b, "%.2f µs", ms * 1e3);
  else if (ms < 1000) std::snprintf(b, sizeof b, "%.3f ms", ms);
  else std::snprintf(b, sizeof b, "%.2f s", ms / 1e3);
  return b;
}

std::string format_speedup(double x) {
  if (!(x > 0)) return "—";
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", x);
  return b;
}

std::string format_seconds(double s) {
  if (!(s > 0)) return "—";
  char b[32];
  std::snprintf(b, sizeof b, s < 10 ? "%.2f s" : "%.1f s", s);
  return b;
}

std::string render_report_html(const Report& r) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
                  "content=\"width=device-width\"><title>kernelcraft report</title><style>";
  s += kStyle;
  s += "</style></head>\n<body data-rendered=\"pending\"><pre id=\"kc-errors\"></pre><script>";
  s += kErrorScript;
  s += "</script>\n" + header_html(r) + summary_html(r) + keys_table(r) + "\n<h2>Per key</h2>\n";
  for (size_t i = 0; i < r.keys.size(); ++i) s += key_section(r.keys[i], i, peak_of(r, r.keys[i].key)) + "\n";
  s += "<script type=\"application/json\" id=\"kc-data\">" + script_safe_json(to_json(r)) + "</script>\n<script>";
  s += kMainScript;
  return s + "</script></body></html>\n";
}

}  // namespace kc::cli
