// Progress on a terminal: a bar redrawn in place on a terminal, or a line every `every` steps
// when the output is a file or a pipe, and a line per evaluation. Attach it to one peer's
// trainer (rank 0, say); it prints that peer's figures.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "decentrain/train/metrics.hpp"

namespace decentrain::train {

inline std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(seconds > 0 ? seconds : 0);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  return buf;
}

class progress {
 public:
  // `out` must outlive the hooks; `tty` draws a bar with carriage returns.
  progress(std::FILE* out, bool tty, std::int64_t every = 50) : out_(out), tty_(tty), every_(every > 0 ? every : 50) {}

  template <class Trainer>
  void attach(Trainer& t) {
    const std::int64_t total = t.options().steps;
    // The step fit() started from is known only at the first step: a fault policy may restore
    // a checkpoint inside fit(), after attach.
    t.on_step([this, total, first = std::int64_t{-1}](const step_metrics& m) mutable {
      if (first < 0) first = m.step - 1;
      const double per_step = m.wall_s / static_cast<double>(m.step - first);
      const std::string eta = format_duration(per_step * static_cast<double>(total - m.step));
      if (tty_) {
        const int width = 30, done = static_cast<int>(width * m.step / total);
        std::fprintf(out_, "\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  %.1f MB sent  ETA %s   ",
                     std::string(static_cast<std::size_t>(done), '=').c_str(),
                     std::string(static_cast<std::size_t>(width - done), ' ').c_str(), static_cast<long long>(m.step),
                     static_cast<long long>(total), m.loss, m.tokens_per_s, static_cast<double>(m.bytes_sent) / 1e6, eta.c_str());
        drawn_ = true;
      } else if (m.step % every_ == 0 || m.step == total) {
        std::fprintf(out_, "step %lld/%lld  loss %.4f  %.0f tok/s  %.1f MB sent  ETA %s\n", static_cast<long long>(m.step),
                     static_cast<long long>(total), m.loss, m.tokens_per_s, static_cast<double>(m.bytes_sent) / 1e6, eta.c_str());
      }
      std::fflush(out_);
    });
    t.on_eval([this](const eval_point& p) {
      std::fprintf(out_, "%sstep %lld: val loss %.4f  (sent %.2f MB, clock %.1f s)\n", drawn_ ? "\n" : "",
                   static_cast<long long>(p.step), p.val_loss, static_cast<double>(p.bytes_sent) / 1e6, p.clock_s);
      drawn_ = false;
      std::fflush(out_);
    });
  }

 private:
  std::FILE* out_;
  bool tty_;
  std::int64_t every_;
  bool drawn_ = false;
};

}  // namespace decentrain::train
