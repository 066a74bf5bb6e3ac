// The evolve progress bar (progress.h): a small renderer, no terminal library needed for one line.
#include "torch_ops/cli/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace kc::cli {
namespace {

std::string clock_text(double s) {
  if (s < 0 || s > 360000) return "--:--";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%02ld:%02ld", t / 60, t % 60);
  return buf;
}

int terminal_width(std::FILE* f) {
  winsize w{};
  if (ioctl(fileno(f), TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
  return 100;
}

}  // namespace

EvolveProgress::EvolveProgress(std::FILE* out, size_t total_keys)
    : out_(out), tty_(isatty(fileno(out)) != 0), total_(total_keys) {}

EvolveProgress::~EvolveProgress() {
  if (tty_ && drawn_) std::fputc('\n', out_);
}

void EvolveProgress::start_key(const std::string& key) {
  key_ = key;
  cur_ = {};
  if (tty_) draw();
  else std::fprintf(out_, "[%zu/%zu] evolving %s\n", done_ + 1, total_, key.c_str());
}

void EvolveProgress::step(const evolve::SearchProgress& p) {
  cur_ = p;
  if (p.best_ms > 0 && p.eager_ms > 0) best_speedup_ = std::max(best_speedup_, p.eager_ms / p.best_ms);
  if (tty_) draw();
}

void EvolveProgress::line(const std::string& text) {
  if (tty_) std::fprintf(out_, "\r\033[K%s\n", text.c_str());
  else std::fprintf(out_, "  %s\n", text.c_str());
  if (tty_) draw();
}

void EvolveProgress::end_key(const evolve::EvolveResult& r) {
  ++done_;
  if (r.best_ms > 0 && r.eager_ms > 0) best_speedup_ = std::max(best_speedup_, r.eager_ms / r.best_ms);
  cur_ = {};
  if (tty_) draw();
}

// Keys done plus the current key's share, judged by its generations (the search's own clock).
double EvolveProgress::fraction_done() const {
  double f = static_cast<double>(done_);
  if (done_ < total_ && cur_.max_generations > 0)
    f += std::min(1.0, static_cast<double>(cur_.generation) / cur_.max_generations);
  return total_ ? f / static_cast<double>(total_) : 1.0;
}

std::string EvolveProgress::bar_text() const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double f = fraction_done();
  const double eta = f > 0.005 ? elapsed * (1 - f) / f : -1;
  char gen[32] = "-", best[32] = "-", head[200];
  if (cur_.max_generations > 0)
    std::snprintf(gen, sizeof gen, "%d/%d", std::min(cur_.generation + 1, cur_.max_generations), cur_.max_generations);
  if (best_speedup_ > 0) std::snprintf(best, sizeof best, "%.2fx", best_speedup_);
  std::snprintf(head, sizeof head, " %zu/%zu keys | gen %s | best %s | %s elapsed | ETA %s | ", done_, total_, gen,
                best, clock_text(elapsed).c_str(), clock_text(eta).c_str());
  const int width = 24;
  const int fill = static_cast<int>(f * width + 0.5);
  std::string bar = "[" + std::string(fill, '#') + std::string(width - fill, '-') + "]" + head;
  const size_t room = static_cast<size_t>(terminal_width(out_)) - 1;
  if (bar.size() + key_.size() <= room) return bar + key_;
  // The key's tail is the informative part (op and shapes): keep it, elide the front.
  const size_t keep = room > bar.size() + 3 ? room - bar.size() - 3 : 0;
  return bar + "..." + key_.substr(key_.size() - std::min(keep, key_.size()));
}

void EvolveProgress::draw() {
  std::fprintf(out_, "\r\033[K%s", bar_text().c_str());
  std::fflush(out_);
  drawn_ = true;
}

}  // namespace kc::cli
