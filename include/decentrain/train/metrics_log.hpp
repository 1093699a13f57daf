// A run's metrics as JSON lines: first the run's configuration, then a line per step and per
// evaluation, each naming its peer (`rank`) with a timestamp. Non-finite numbers are written as
// null (JSON has no NaN). One log may serve every peer of a process: lines never interleave.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/core/dtype.hpp"
#include "decentrain/io/json.hpp"
#include "decentrain/train/metrics.hpp"

namespace decentrain::train {

// One JSON object on one line, built field by field.
class json_line {
 public:
  json_line& add(std::string_view key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");
    // The shortest text that reads back as v: exact, so unix times keep their fractions.
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    return raw(key, std::string(buf, end));
  }
  json_line& add(std::string_view key, std::int64_t v) { return raw(key, std::to_string(v)); }
  json_line& add(std::string_view key, std::uint64_t v) { return raw(key, std::to_string(v)); }
  json_line& add(std::string_view key, int v) { return raw(key, std::to_string(v)); }
  json_line& add(std::string_view key, bool v) { return raw(key, v ? "true" : "false"); }
  json_line& add(std::string_view key, std::string_view v) { return raw(key, io::json_quote(v)); }
  json_line& add(std::string_view key, const char* v) { return add(key, std::string_view(v)); }
  // A value that is JSON already (an array or object built with other json_lines).
  json_line& add_json(std::string_view key, const std::string& json) { return raw(key, json); }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  json_line& raw(std::string_view key, const std::string& value) {
    if (!body_.empty()) body_ += ',';
    body_ += io::json_quote(key) + ":" + value;
    return *this;
  }
  std::string body_;
};

template <class P>
const char* policy_name() {
  if constexpr (requires { { P::name } -> std::convertible_to<const char*>; })
    return P::name;
  else
    return "custom";
}

class metrics_log {
 public:
  // `out` must outlive the log; `run` holds fields of the configuration line beyond the
  // trainer's own (the data, the links).
  explicit metrics_log(std::ostream& out, json_line run = {}) : out_(&out), run_(std::move(run)) {}

  // Writes the configuration line (once, from the first trainer attached) and then a line per
  // step and per evaluation of `t`.
  template <class Trainer>
  void attach(Trainer& t) {
    {
      std::lock_guard lock(mutex_);
      if (!configured_) {
        const auto& o = t.options();
        auto line = run_;
        line.add("event", "config")
            .add("world", t.world())
            .add("comm", policy_name<typename Trainer::comm_policy>())
            .add("parallel", policy_name<typename Trainer::parallel_policy>())
            .add("fault", policy_name<typename Trainer::fault_policy>())
            .add("parameters", static_cast<std::int64_t>(t.model().parameters().numel()))
            .add("steps", o.steps)
            .add("batch_size", o.batch_size)
            .add("lr", o.lr)
            .add("min_lr", o.floor_lr())
            .add("warmup_steps", o.warmup())
            .add("beta1", o.beta1)
            .add("beta2", o.beta2)
            .add("weight_decay", o.weight_decay)
            .add("grad_clip", o.grad_clip)
            .add("seed", o.seed)
            .add("compute_dtype", dtype_name(o.compute_dtype));
        write(line);
        configured_ = true;
      }
    }
    t.on_step([this](const step_metrics& m) {
      json_line line;
      line.add("event", "step")
          .add("rank", m.rank)
          .add("time", m.unix_time)
          .add("wall_s", m.wall_s)
          .add("step", m.step)
          .add("loss", m.loss)
          .add("lr", m.lr)
          .add("grad_norm", m.grad_norm)
          .add("tokens_per_s", m.tokens_per_s)
          .add("tokens", m.tokens)
          .add("bytes_sent", m.bytes_sent)
          .add("framing_bytes_sent", m.framing_bytes_sent)
          .add("bytes_received", m.bytes_received)
          .add("policy_bytes_sent", m.policy_bytes_sent)
          .add("network_wait_s", m.network_wait_s)
          .add("clock_s", m.clock_s)
          .add("compute_s", m.compute_s)
          .add("peak_send_rate", m.peak_send_rate);
      std::lock_guard lock(mutex_);
      write(line);
    });
    t.on_eval([this](const eval_point& p) {
      json_line line;
      line.add("event", "eval")
          .add("rank", p.rank)
          .add("time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count())
          .add("step", p.step)
          .add("val_loss", p.val_loss)
          .add("bytes_sent", p.bytes_sent)
          .add("policy_bytes_sent", p.policy_bytes_sent)
          .add("clock_s", p.clock_s);
      if (p.consensus_distance >= 0) line.add("consensus_distance", p.consensus_distance);
      std::lock_guard lock(mutex_);
      write(line);
    });
  }
  // A line of the caller's, for what the trainer does not report itself (a tuned policy's pick).
  void event(const json_line& line) {
    std::lock_guard lock(mutex_);
    write(line);
  }

 private:
  void write(const json_line& line) {
    *out_ << line.str() << '\n';
    out_->flush();
  }

  std::ostream* out_;
  json_line run_;
  std::mutex mutex_;
  bool configured_ = false;
};

}  // namespace decentrain::train
