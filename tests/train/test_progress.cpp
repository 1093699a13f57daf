// train::progress: a bar that fits the terminal and redraws a few times a second, or lines every
// log_every steps; fed through a stand-in for the trainer's hooks.
#include <decentrain/train/options.hpp>
#include <decentrain/train/progress.hpp>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace dt = decentrain;

namespace {

// What progress::attach needs of a trainer: its options and the two hooks.
struct hooks {
  dt::train::trainer_options opts;
  std::function<void(const dt::train::step_metrics&)> step;
  std::function<void(const dt::train::eval_point&)> eval;
  const dt::train::trainer_options& options() const { return opts; }
  void on_step(std::function<void(const dt::train::step_metrics&)> f) { step = std::move(f); }
  void on_eval(std::function<void(const dt::train::eval_point&)> f) { eval = std::move(f); }
};

// Runs `steps` steps, one per millisecond of the run, through a progress with `o`, and returns what it printed.
std::string drive(dt::train::progress::options o, std::int64_t steps, std::int64_t eval_at = -1) {
  char* buf = nullptr;
  std::size_t size = 0;
  std::FILE* out = ::open_memstream(&buf, &size);
  REQUIRE(out != nullptr);
  {
    dt::train::progress bar(out, o);
    hooks t;
    t.opts.steps = steps;
    bar.attach(t);
    for (std::int64_t s = 1; s <= steps; ++s) {
      dt::train::step_metrics m;
      m.step = s;
      m.loss = 3.0;
      m.tokens_per_s = 123456;
      m.wall_s = 0.001 * static_cast<double>(s);
      t.step(m);
      if (s == eval_at && t.eval) t.eval(dt::train::eval_point{0, s, 2.5, 0, 1.0, 0});
    }
  }
  std::fclose(out);
  std::string text(buf, size);
  std::free(buf);
  return text;
}

// The lines a terminal would show after each carriage return, each without its ESC[K.
std::vector<std::string> redraws(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while ((at = text.find('\r', at)) != std::string::npos) {
    const auto end = text.find_first_of("\r\n", at + 1);
    std::string line = text.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
    if (const auto k = line.find("\x1b[K"); k != std::string::npos) line.erase(k);
    if (!line.empty()) out.push_back(line);
    at += 1;
  }
  return out;
}

}  // namespace

TEST_CASE("progress: on a terminal, a bar within the width, redrawn at most every redraw_s", "[train][progress]") {
  // 2000 steps over 2 s of the run, redrawn at most every 0.25 s: the first step, then about 8, and the last.
  const auto text = drive({.tty = true, .log_every = 50, .width = 100, .redraw_s = 0.25}, 2000);
  const auto lines = redraws(text);
  CHECK(lines.size() >= 8);
  CHECK(lines.size() <= 10);
  for (const auto& l : lines) {
    INFO(l);
    CHECK(l.size() == 99);  // the bar takes the room left, but never the last column: a full line would wrap
    CHECK(l.front() == '[');
  }
  CHECK(lines.back().find("step 2000/2000") != std::string::npos);
  const auto close = lines.back().find(']');
  REQUIRE(close != std::string::npos);
  CHECK(lines.back().substr(1, close - 1).find_first_not_of('=') == std::string::npos);  // the last bar is full
  CHECK(text.find('\n') == std::string::npos);  // no line feeds: every redraw is in place

  // Too narrow for a bar: the figures alone, cut to the width.
  for (const auto& l : redraws(drive({.tty = true, .width = 40, .redraw_s = 0.25}, 100))) {
    CHECK(l.size() <= 39);
    CHECK(l.rfind("step ", 0) == 0);
  }
}

TEST_CASE("progress: an evaluation clears the bar, prints a line, and the bar comes back below", "[train][progress]") {
  const auto text = drive({.tty = true, .width = 100, .redraw_s = 0}, 10, 5);
  const auto eval = text.find("\r\x1b[Kstep 5: val loss 2.5000");
  REQUIRE(eval != std::string::npos);
  CHECK(text.find("step 6/10", eval) != std::string::npos);
}

TEST_CASE("progress: without a terminal, a line every log_every steps and at the last, 0 for none", "[train][progress]") {
  const auto text = drive({.tty = false, .log_every = 30}, 100);
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 4);  // 30, 60, 90, 100
  CHECK(lines[0].rfind("step 30/100  loss 3.0000  123456 tok/s", 0) == 0);
  CHECK(lines[3].rfind("step 100/100", 0) == 0);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(drive({.tty = false, .log_every = 0}, 100).empty());
  CHECK(drive({.tty = false, .evaluations = false}, 10, 5).find("val loss") == std::string::npos);
}

TEST_CASE("progress: the width is the terminal's (TIOCGWINSZ on a pseudo-terminal)", "[train][progress]") {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  winsize ws{};
  ws.ws_col = 57;
  ws.ws_row = 20;
  REQUIRE(::ioctl(master, TIOCSWINSZ, &ws) == 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  REQUIRE(slave >= 0);
  std::FILE* out = ::fdopen(slave, "w");
  REQUIRE(out != nullptr);
  CHECK(dt::train::progress(out, {.tty = true}).columns() == 57);
  CHECK(dt::train::progress(out, {.tty = true, .width = 33}).columns() == 33);  // a set width wins
  std::fclose(out);
  ::close(master);
}
