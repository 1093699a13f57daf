// Progress on a terminal: a bar redrawn in place, fitted to the terminal's width and at most a
// few times a second, or a line every `log_every` steps when the output is a file or a pipe; and
// a line per evaluation. Attach it to one peer's trainer (rank 0, say); it prints that peer's
// figures.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#if __has_include(<sys/ioctl.h>)
#include <sys/ioctl.h>
#include <unistd.h>
#define DECENTRAIN_HAS_TIOCGWINSZ 1
#endif

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
  struct options {
    bool tty = false;             // draw a bar in place (the output is a terminal) rather than lines
    std::int64_t log_every = 50;  // without a terminal: a line every this many steps, and at the last; 0: none
    int width = 0;                // the bar's line, in columns; 0: the terminal's (TIOCGWINSZ), else 80
    double redraw_s = 0.2;        // on a terminal: at most one redraw per this many seconds of the run
    bool evaluations = true;      // a line per evaluation
  };

  // `out` must outlive the hooks.
  progress(std::FILE* out, options o) : out_(out), o_(o) {}

  template <class Trainer>
  void attach(Trainer& t) {
    const std::int64_t total = t.options().steps;
    // The step fit() started from is known only at the first step: a fault policy may restore
    // a checkpoint inside fit(), after attach.
    t.on_step([this, total, first = std::int64_t{-1}](const step_metrics& m) mutable {
      if (first < 0) first = m.step - 1;
      const bool last = m.step == total;
      if (o_.tty) {
        if (!last && drawn_ && m.wall_s - drawn_at_ < o_.redraw_s) return;
        draw(m, total, first);
        drawn_at_ = m.wall_s;
      } else if (o_.log_every > 0 && (m.step % o_.log_every == 0 || last)) {
        std::fprintf(out_, "%s\n", figures(m, total, first).c_str());
      } else {
        return;
      }
      std::fflush(out_);
    });
    if (!o_.evaluations) return;
    t.on_eval([this](const eval_point& p) {
      std::fprintf(out_, "%sstep %lld: val loss %.4f  (sent %.2f MB, clock %.1f s)\n", drawn_ ? "\r\x1b[K" : "",
                   static_cast<long long>(p.step), p.val_loss, static_cast<double>(p.bytes_sent) / 1e6, p.clock_s);
      drawn_ = false;  // the bar comes back below it at the next redraw
      std::fflush(out_);
    });
  }

  // The columns a bar may take: the set width, else the terminal's.
  int columns() const {
    if (o_.width > 0) return o_.width;
#if defined(DECENTRAIN_HAS_TIOCGWINSZ)
    winsize ws{};
    if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
#endif
    return 80;
  }

 private:
  static std::string figures(const step_metrics& m, std::int64_t total, std::int64_t first) {
    const double per_step = m.wall_s / static_cast<double>(std::max<std::int64_t>(1, m.step - first));
    char buf[192];
    std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  %.0f tok/s  %.1f MB sent  ETA %s", static_cast<long long>(m.step),
                  static_cast<long long>(total), m.loss, m.tokens_per_s, static_cast<double>(m.bytes_sent) / 1e6,
                  format_duration(per_step * static_cast<double>(total - m.step)).c_str());
    return buf;
  }
  // One line, never wider than the terminal less its last column (a line that fills it would
  // wrap, and the next carriage return would redraw below it): the bar takes what the figures
  // leave, and goes when fewer than 10 columns are left for it.
  void draw(const step_metrics& m, std::int64_t total, std::int64_t first) {
    const auto room = static_cast<std::size_t>(std::max(1, columns() - 1));
    std::string line = figures(m, total, first);
    if (line.size() + 3 + 10 <= room) {
      const auto width = room - line.size() - 3;
      const auto done = static_cast<std::size_t>(static_cast<double>(width) * static_cast<double>(m.step) /
                                                 static_cast<double>(std::max<std::int64_t>(1, total)));
      std::string bar;
      bar.reserve(room);
      bar.append(1, '[').append(std::min(done, width), '=').append(width - std::min(done, width), ' ').append("] ").append(line);
      line.swap(bar);
    }
    if (line.size() > room) line.resize(room);
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());  // ESC[K: clear what a longer line left
    drawn_ = true;
  }

  std::FILE* out_;
  options o_;
  bool drawn_ = false;
  double drawn_at_ = 0;
};

}  // namespace decentrain::train
