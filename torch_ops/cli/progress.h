// Progress of `kernelcraft evolve` over many keys: a one-line bar on a terminal (keys done of
// total, the current key's generation, the best speedup so far, elapsed time and ETA), plain lines
// elsewhere. Event lines print above the bar, which is redrawn under them.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

#include "evolve/worker/worker.h"

namespace kc::cli {

class EvolveProgress {
 public:
  // Writes to `out`; the bar only when `out` is a terminal (plain lines otherwise).
  EvolveProgress(std::FILE* out, size_t total_keys);
  ~EvolveProgress();   // leaves the terminal on a fresh line
  void start_key(const std::string& key);
  void step(const evolve::SearchProgress& p);
  // One event line (a candidate's verdict, a key's result) above the bar.
  void line(const std::string& text);
  void end_key(const evolve::EvolveResult& r);

 private:
  void draw();
  std::string bar_text() const;
  double fraction_done() const;

  std::FILE* out_;
  bool tty_;
  size_t total_, done_ = 0;
  std::string key_;
  evolve::SearchProgress cur_;
  double best_speedup_ = 0;   // over all keys so far
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  bool drawn_ = false;
};

}  // namespace kc::cli
