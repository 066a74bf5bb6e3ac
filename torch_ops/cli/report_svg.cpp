// Inline SVG charts for the report page (report_svg.h). Coordinates are computed here, so the
// page draws the same with scripts off, and the headless test sees finished markup.
#include "torch_ops/cli/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "torch_ops/cli/report_html.h"

namespace kc::cli {
namespace {

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

constexpr const char* kSearchColor = "#4e79a7";
constexpr const char* kVerifyColor = "#f28e2b";
constexpr const char* kSanitizerColor = "#59a14f";
constexpr size_t kMaxBars = 60;   // a cache of thousands of keys still gives a readable chart

std::string svg_open(int w, int h, const std::string& label) {
  return fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
             "role=\"img\" aria-label=\"", w, h, w, h) + html_escape(label) + "\">";
}

std::string text_at(double x, double y, const std::string& s, const char* anchor = "start", const char* cls = "") {
  return fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" class=\"%s\">", x, y, anchor, cls) + html_escape(s) +
         "</text>";
}

// A linear axis over [lo, hi] onto [a, b] pixels (b < a for y axes drawn upwards).
struct Scale {
  double lo, hi, a, b;
  double operator()(double v) const { return hi > lo ? a + (v - lo) / (hi - lo) * (b - a) : (a + b) / 2; }
};

// The generation axis of the curve chart: one label per generation, thinned past a dozen.
std::string generation_ticks(const std::vector<GenerationBest>& curve, const Scale& x, double y) {
  std::string out;
  const size_t step = std::max<size_t>(1, (curve.size() + 11) / 12);
  for (size_t i = 0; i < curve.size(); i += step)
    out += text_at(x(static_cast<double>(i)), y, fmt("g%d", curve[i].generation), "middle", "tick");
  return out;
}

}  // namespace

std::string svg_search_curve(const KeyReport& k) {
  double lo = 0, hi = 0;
  for (const auto& g : k.curve)
    for (double v : {g.best_ms, g.best_so_far_ms})
      if (v > 0) {
        lo = lo == 0 ? v : std::min(lo, v);
        hi = std::max(hi, v);
      }
  if (hi == 0) return "";
  // Eager joins the axis when it is near the curve; far above it would flatten the curve.
  const bool eager_on_axis = k.eager_ms > 0 && k.eager_ms <= hi * 1.5;
  if (eager_on_axis) {
    lo = std::min(lo, k.eager_ms);
    hi = std::max(hi, k.eager_ms);
  }
  const double pad = (hi - lo) * 0.1 + hi * 0.02;
  const int W = 440, H = 190, L = 78, R = 14, T = 16, B = 40;
  Scale x{0, static_cast<double>(k.curve.size() - 1), L + 10.0, W - R - 10.0};
  Scale y{std::max(0.0, lo - pad), hi + pad, H - B + 0.0, T + 0.0};
  std::string s = svg_open(W, H, "best time per generation of " + k.key);
  s += fmt("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" class=\"plot\"/>", L, T, W - L - R, H - T - B);
  for (double v : {y.lo, (y.lo + y.hi) / 2, y.hi}) s += text_at(L - 6, y(v) + 4, format_ms(v), "end", "tick");
  s += generation_ticks(k.curve, x, H - B + 16);
  s += text_at((L + W - R) / 2.0, H - 6, "generation", "middle", "axis");
  if (eager_on_axis) {
    s += fmt("<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"eager\"/>", L, W - R, y(k.eager_ms), y(k.eager_ms));
    s += text_at(W - R - 4, y(k.eager_ms) - 4, "eager " + format_ms(k.eager_ms), "end", "tick");
  } else if (k.eager_ms > 0) {
    s += text_at(W - R - 4, T + 12, "eager " + format_ms(k.eager_ms) + " (above the chart)", "end", "tick");
  }
  std::string line;
  for (size_t i = 0; i < k.curve.size(); ++i)
    if (k.curve[i].best_so_far_ms > 0) line += fmt("%.1f,%.1f ", x(static_cast<double>(i)), y(k.curve[i].best_so_far_ms));
  s += "<polyline points=\"" + line + "\" class=\"best\"/>";
  for (size_t i = 0; i < k.curve.size(); ++i) {
    const GenerationBest& g = k.curve[i];
    if (g.best_ms <= 0) continue;
    s += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" class=\"gen\"><title>", x(static_cast<double>(i)), y(g.best_ms)) +
         html_escape("generation " + std::to_string(g.generation) + ": best " + format_ms(g.best_ms) + ", " +
                     std::to_string(g.passed) + " of " + std::to_string(g.evaluated) + " passed") + "</title></circle>";
  }
  return s + "</svg>";
}

std::string svg_speedups(const std::vector<KeyReport>& keys) {
  std::vector<std::pair<double, size_t>> bars;   // speedup, index into keys (the page's #key-N)
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].speedup > 0 && (keys[i].state == KeyState::kServed || keys[i].state == KeyState::kEagerBest))
      bars.push_back({keys[i].speedup, i});
  if (bars.empty()) return "";
  std::stable_sort(bars.begin(), bars.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (bars.size() > kMaxBars) bars.resize(kMaxBars);
  const double lo = std::min(0.5, bars.back().first / 1.25), hi = std::max(2.0, bars.front().first * 1.25);
  const int W = 760, L = 250, R = 70, T = 24, row = 18;
  const int H = T + row * static_cast<int>(bars.size()) + 10;
  Scale x{std::log(lo), std::log(hi), L + 0.0, W - R + 0.0};
  std::string s = svg_open(W, H, "speedup over eager per key");
  for (double t : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0}) {
    if (t < lo || t > hi) continue;
    s += fmt("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" class=\"%s\"/>", x(std::log(t)), x(std::log(t)), T - 4,
             H - 6, t == 1.0 ? "one" : "grid");
    s += text_at(x(std::log(t)), T - 8, format_speedup(t), "middle", "tick");
  }
  for (size_t r = 0; r < bars.size(); ++r) {
    const KeyReport& k = keys[bars[r].second];
    const double y = T + row * static_cast<double>(r), x0 = x(0.0), x1 = x(std::log(bars[r].first));
    s += text_at(L - 6, y + 13, fmt("#%zu ", bars[r].second + 1) + k.op, "end", "tick");
    s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" class=\"%s\"><title>", std::min(x0, x1), y + 3,
             std::max(1.0, std::fabs(x1 - x0)), row - 5, bars[r].first >= 1 ? "faster" : "slower") +
         html_escape(k.key) + "</title></rect>";
    s += text_at(std::max(x0, x1) + 4, y + 13, format_speedup(bars[r].first), "start", "tick");
  }
  return s + "</svg>";
}

std::string svg_time_by_op(const std::vector<Totals>& ops) {
  double hi = 0;
  for (const auto& o : ops) hi = std::max(hi, o.time.total());
  if (hi <= 0) return "";
  const int W = 760, L = 250, R = 80, T = 34, row = 20;
  const int H = T + row * static_cast<int>(ops.size()) + 8;
  Scale x{0, hi, L + 0.0, W - R + 0.0};
  std::string s = svg_open(W, H, "where the time went, per operator");
  const std::pair<const char*, const char*> parts[] = {
      {"search", kSearchColor}, {"verification", kVerifyColor}, {"sanitizers", kSanitizerColor}};
  for (size_t p = 0; p < 3; ++p) {
    s += fmt("<rect x=\"%zu\" y=\"6\" width=\"12\" height=\"12\" fill=\"%s\"/>", L + p * 130, parts[p].second);
    s += text_at(static_cast<double>(L + p * 130 + 16), 16, parts[p].first);
  }
  for (size_t r = 0; r < ops.size(); ++r) {
    const Totals& o = ops[r];
    const double y = T + row * static_cast<double>(r);
    s += text_at(L - 6, y + 14, o.op, "end", "tick");
    double at = 0;
    const double v[] = {o.time.search_s, o.time.verification_s, o.time.sanitizer_s};
    for (size_t p = 0; p < 3; ++p) {
      if (v[p] <= 0) continue;
      s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"><title>", x(at), y + 3,
               std::max(0.5, x(at + v[p]) - x(at)), row - 6, parts[p].second) +
           html_escape(std::string(parts[p].first) + " " + format_seconds(v[p])) + "</title></rect>";
      at += v[p];
    }
    s += text_at(x(at) + 4, y + 14, format_seconds(at), "start", "tick");
  }
  return s + "</svg>";
}

}  // namespace kc::cli
