// Rounds that go on without their stragglers: a periodic average closes at a deadline the
// replicas' own arrivals set (hivemind issue 676), not when the last replica comes.
//
// The round's leader takes each replica's arrival at the round's end and closes the round once a
// quorum is in and the deadline has passed: the first arrival plus the median of recent arrival
// offsets (each after its round's first arrival) plus k robust deviations (1.4826 times their
// median absolute deviation, a normal's sigma), and never less than a share of the round's
// planned compute. Until enough offsets were seen, and with every replica in, it closes at once.
// The first arrival is of a replica that ran the round whole (see lead).
// The group message carries the members, the offsets the leader measured and the replicas'
// speeds, so every replica keeps the same history, and names the next leader: the member with
// the fewest seconds an inner step (its fine steps absorb a straggling one, so it comes on time
// most often; a round waits for its leader, as hivemind's group leader). The replicas in average
// among themselves; one that comes later takes the group's average from the leader, applies the
// same outer step (every replica keeps the same global parameters and momentum), drops its own
// round (counted) and skips the steps the group took meanwhile, so it reaches the next round's
// end with the group instead of trailing it for good. `fixed_s` closes at a fixed time after the
// first arrival instead: a fixed timeout, which bench/deadlines compares against.
//
// Offsets are on the leader's clock: the simulated arrival on simulated links; elsewhere, for an
// arrival the leader finds waiting when it arrives itself, its own round's start plus the
// replica's round length on the replica's clock (so clocks need not agree).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/comm/policy.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::comm {

struct round_deadline {
  static constexpr double max_seconds = 1e6;  // (any time a replica reports is capped there)
  double k = 2;            // robust deviations past the median offset
  double quorum = 0.5;     // of the replicas: the fewest a round closes with (rounded up; the leader one of them)
  double min_wait = 0.1;   // of the round's planned compute: the least the deadline allows after the first arrival
  std::size_t window = 64; // arrival offsets kept, the most recent
  // Offsets seen before the deadline applies (0: two rounds' worth, 2 (replicas - 1)); until then
  // a round waits for every replica.
  std::size_t warmup = 0;
  // Set: close this many seconds after the first arrival instead (a fixed timeout).
  std::optional<double> fixed_s{};

  void validate(const char* who) const {
    decentrain::detail::check(std::isfinite(k) && k >= 0, who, ": deadline's k must be >= 0, got ", k);
    decentrain::detail::check(quorum > 0 && quorum <= 1, who, ": deadline's quorum must be in (0, 1], got ", quorum);
    decentrain::detail::check(std::isfinite(min_wait) && min_wait >= 0, who, ": deadline's min_wait must be >= 0, got ", min_wait);
    decentrain::detail::check(window >= 1, who, ": deadline's window must keep at least 1 offset");
    decentrain::detail::check(!fixed_s || (std::isfinite(*fixed_s) && *fixed_s >= 0 && *fixed_s <= max_seconds), who,
                              ": deadline's fixed_s must be a number of seconds in [0, 1e6], got ", fixed_s.value_or(0));
  }
  std::string describe() const {
    if (fixed_s) return "deadline " + format_number(*fixed_s) + " s after the first arrival";
    return "deadline median + " + format_number(k) + " MAD, quorum " + format_number(quorum);
  }
  // The fewest replicas of `n` a round closes with.
  int quorum_of(int n) const { return std::clamp(static_cast<int>(std::ceil(quorum * n - 1e-9)), 1, n); }

 private:
  static std::string format_number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", v);
    return text;
  }
};

// What the leader saw of a round (seconds after the round's start on its clock: the end of the
// previous round's exchange).
struct deadline_round_record {
  std::int64_t round = 0;
  int replicas = 0, members = 0;
  double first_s = 0, quorum_s = 0, close_s = 0;  // the first arrival, the quorum's last, the close
  double leader_s = 0;                            // the leader's own arrival (it closes no sooner)
  double deadline_s = 0;                          // the deadline after the first arrival (infinite: every replica waited for)
};
// One replica's arrival at a round's end, as the leader took it; `in`: it made the round;
// `part`: its arrival is no measure of the round's length (see deadline_rounds::started).
struct deadline_arrival {
  std::int64_t round = 0;
  int replica = -1;
  double after_start_s = 0;
  bool in = false;
  bool part = false;
};

// The protocol's state on one replica.
class deadline_rounds {
 public:
  static constexpr std::size_t max_records = 1 << 16;  // (records kept, the most recent)

  // The group of a round, as its leader closed it.
  struct closing {
    std::vector<int> members;  // ascending
    double slowest_s = 0;      // the slowest replica's seconds per inner step, for the next round's sizing
    int leader = 0;            // the replica that closed it
    bool in = false;           // this replica is one of the members
  };

  deadline_rounds() = default;
  deadline_rounds(const deadline_rounds&) {}  // (a copy starts unmeasured)
  deadline_rounds& operator=(const deadline_rounds& o) {
    if (this != &o) forget_view();
    return *this;
  }

  // A step of the round taken: `seconds` of compute over `inner_steps` (a redone step counts once).
  void add_step(std::int64_t step, double seconds, std::int64_t inner_steps) {
    if (step <= through_ || inner_steps < 1 || !(seconds > 0)) return;
    through_ = step;
    if (step_seconds_.size() < max_records) step_seconds_.push_back(seconds / static_cast<double>(inner_steps));
  }
  // This round's typical seconds per inner step: the median of its steps', so that a straggling
  // step does not plan the next round longer for every replica (0: none measured).
  double typical_step_s() const {
    if (step_seconds_.empty()) return 0;
    std::vector<double> v = step_seconds_;
    return median_of(v);
  }

  // The round's start on this replica's clock (the leader's records count from it). `part`: the
  // replica's arrival will be no measure of the round's length (see lead): it goes on partway
  // into the round (it came late to the one before and skipped steps; it was restored, or took
  // another replica's state, mid-round), or plans it at a pace it has not measured (a joiner's
  // first round).
  template <class Comm>
  void started(Comm& replicas, bool part = false) {
    previous_first_after_start_ = first_after_start_;
    start_ = now_s(replicas.endpoint());
    part_ = part;
  }

  // At round `round`'s end, with this replica's seconds per inner step this round, the round's
  // planned compute seconds and the size of an average: the group the leader closed. On the
  // leader it waits for the arrivals and sends the group to every other replica; on the others
  // it sends the arrival and waits for the group.
  template <class Comm>
  closing close(const round_deadline& d, Comm& replicas, std::int64_t round, double per_step_s, double planned_s,
                std::size_t average_bytes) {
    const int n = replicas.world();
    step_seconds_.clear();
    if (static_cast<int>(speeds_.size()) != n) speeds_.assign(static_cast<std::size_t>(n), 0.0);
    speeds_[static_cast<std::size_t>(replicas.rank())] = per_step_s;
    auto& ep = replicas.endpoint();
    // (a transport that bounds what it queues takes averages unasked: a few, for a replica that
    // misses rounds in a row)
    transport::allow(ep, result_tag, 4 * average_bytes);
    decentrain::detail::check(leader_ >= 0 && leader_ < n, "diloco: round ", round, "'s leader is replica ", leader_,
                              ", outside a group of ", n);
    if (replicas.rank() != leader_) {
      // (the round's length on this replica's clock: where the leader cannot time the arrival
      // itself, it is its own round's start plus that)
      const double arrived[arrival_fields] = {static_cast<double>(round), per_step_s, now_s(ep) - start_, part_ ? 1.0 : 0.0};
      ep.send(leader_, arrival_tag, std::as_bytes(std::span<const double>(arrived)));
      return take_group(d, ep.recv(leader_, group_tag), n, round, replicas.rank());
    }
    return lead(d, replicas, round, planned_s);
  }
  // The leader, after the members' average: the average to every replica that missed the round.
  template <class Comm>
  void send_result(Comm& replicas, const closing& c, std::span<const float> average) {
    if (replicas.rank() != c.leader) return;
    for (int r = 0; r < replicas.world(); ++r)
      if (!std::binary_search(c.members.begin(), c.members.end(), r))
        replicas.endpoint().send(r, result_tag, std::as_bytes(average));
  }
  // A replica that missed the round: the group's average.
  template <class Comm>
  void take_result(Comm& replicas, const closing& c, std::span<float> average) {
    const auto m = replicas.endpoint().recv(c.leader, result_tag);
    decentrain::detail::check(m.size() == average.size_bytes(), "diloco: the round's leader sent an average of ", m.size(),
                              " bytes, where the model's is ", average.size_bytes());
    std::memcpy(average.data(), m.data(), m.size());
    ++missed_;
  }
  // A replica that missed a round: the next group if the leader closed it already.
  template <class Comm>
  std::optional<closing> next_closed(const round_deadline& d, Comm& replicas, std::int64_t round) {
    auto m = replicas.endpoint().try_recv(leader_, group_tag);
    if (!m) return std::nullopt;
    return take_group(d, *m, replicas.world(), round, replicas.rank());
  }

  // A re-formed view: its replicas are other peers (the first of them leads the next round).
  void forget_view() {
    speeds_.clear();
    leader_ = 0;
  }

  // The deadline after a round's first arrival (infinite until enough was seen).
  double deadline_s(const round_deadline& d, int n, double planned_s) const {
    if (d.fixed_s) return *d.fixed_s;
    const std::size_t need = std::clamp<std::size_t>(d.warmup ? d.warmup : 2 * static_cast<std::size_t>(std::max(0, n - 1)), 1, d.window);
    if (offsets_.size() < need) return std::numeric_limits<double>::infinity();
    std::vector<double> v(offsets_.begin(), offsets_.end());
    const double median = median_of(v);
    for (double& x : v) x = std::abs(x - median);
    const double mad = median_of(v);
    return std::max(d.min_wait * std::max(0.0, planned_s), median + d.k * 1.4826 * mad);
  }

  const std::vector<deadline_round_record>& rounds() const { return rounds_; }
  const std::vector<deadline_arrival>& arrivals() const { return arrivals_; }
  std::int64_t missed() const { return missed_; }  // rounds this replica missed
  std::int64_t dropped() const { return dropped_; }  // replicas' rounds the leader closed without

  // This replica's own (io/checkpoint.hpp: left out of a state handed to another replica): its
  // steps' seconds this round, and what it missed or dropped.
  void save(io::checkpoint& c, const std::string& prefix) const {
    c.text[prefix + "deadline.offsets"] = seconds_text(offsets_);
    c.text[prefix + "deadline.own.step_seconds"] = seconds_text(step_seconds_);
    c.counters[prefix + "deadline.through"] = through_;
    c.counters[prefix + "deadline.own.missed"] = missed_;
    c.counters[prefix + "deadline.own.dropped"] = dropped_;
    c.counters[prefix + "deadline.leader"] = leader_;
  }
  // Another replica's state (one handed over: fault::elastic's adopt) keeps this replica's own:
  // its speed, which the round's leader sizes the next round by, is not the donor's. Nor did
  // this replica run the round it lands in whole (its arrival is a part's).
  void load(const io::checkpoint& c, const std::string& prefix) {
    const bool handed = io::leaves_out_own_state(c);
    part_ = part_ || handed;
    offsets_.clear();
    leader_ = 0;
    through_ = -1;
    if (!handed) {
      step_seconds_.clear();
      missed_ = dropped_ = 0;
    }
    const auto it = c.text.find(prefix + "deadline.offsets");
    if (it == c.text.end()) return;
    const auto seconds = [&](const std::string& name, auto& into) {
      const auto at = c.text.find(prefix + name);
      if (at == c.text.end()) return;
      const char* p = at->second.c_str();
      while (*p) {
        char* end = nullptr;
        const double v = std::strtod(p, &end);
        decentrain::detail::check(end != p && std::isfinite(v) && v >= 0, "checkpoint: '", prefix, name,
                                  "' holds something other than seconds >= 0");
        into.push_back(v);
        p = end;
        while (*p == ' ') ++p;
      }
    };
    seconds("deadline.offsets", offsets_);
    while (offsets_.size() > max_records) offsets_.pop_front();
    const auto through = c.counters.find(prefix + "deadline.through");
    through_ = through == c.counters.end() ? -1 : through->second;
    const auto leader = c.counters.find(prefix + "deadline.leader");
    leader_ = leader == c.counters.end() ? 0 : static_cast<int>(leader->second);
    decentrain::detail::check(leader_ >= 0, "checkpoint: '", prefix, "deadline.leader' is ", leader_);
    if (handed) return;
    // (named without "own." in checkpoints written before handed states left them out)
    const auto own = [&](const std::string& name) {
      const std::string key = "deadline.own." + name;
      return c.text.contains(prefix + key) || c.counters.contains(prefix + key) ? key : "deadline." + name;
    };
    seconds(own("step_seconds"), step_seconds_);
    missed_ = c.counter(prefix + own("missed"));
    dropped_ = c.counter(prefix + own("dropped"));
  }

 private:
  static constexpr transport::tag_type channel = transport::tag_type{0x646c6e31u} << 32;  // "dln1"
  static constexpr transport::tag_type arrival_tag = channel | 1, group_tag = channel | 2, result_tag = channel | 3;
  // An arrival: [round, seconds per inner step, the round's length on the replica's clock, part
  // (1: its arrival is no measure of the round's length: see started)].
  static constexpr std::size_t arrival_fields = 4;

  // Seconds as text, exactly (%.17g), space after each.
  template <class Seconds>
  static std::string seconds_text(const Seconds& values) {
    std::string text;
    for (const double v : values) {
      char one[32];
      std::snprintf(one, sizeof one, "%.17g ", v);
      text += one;
    }
    return text;
  }
  template <class E>
  static double now_s(E& ep) {
    return std::chrono::duration<double>(transport::now(ep).time_since_epoch()).count();
  }
  static double median_of(std::vector<double>& v) {
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    if (v.size() % 2) return *mid;
    return (*mid + *std::max_element(v.begin(), mid)) / 2;
  }

  // A group message: [round, slowest s, members, next leader, the first arrival after the round's
  // start (on the leader's clock), then for each replica: in (0/1),
  // its offset after the round's first arrival (members), its offset in the round before (one that
  // came late to it, as the leader took it now; else -1)]. Every replica keeps the offsets in the
  // same order, so whichever leads next sets the same deadline.
  static constexpr std::size_t header = 5, stride = 4;  // (a replica's fields: in, offset, late, speed)
  static std::size_t group_size(int n) { return header + stride * static_cast<std::size_t>(n); }
  static std::size_t field(std::size_t replica, std::size_t f) { return header + stride * replica + f; }

  closing take_group(const round_deadline& d, const transport::bytes& m, int n, std::int64_t round, int me) {
    const std::size_t want = group_size(n) * sizeof(double);
    decentrain::detail::check(m.size() == want, "diloco: the round's leader sent a group of ", m.size(), " bytes, where ", n,
                              " replicas make ", want);
    std::vector<double> v(group_size(n));
    std::memcpy(v.data(), m.data(), m.size());
    decentrain::detail::check(v[0] == static_cast<double>(round), "diloco: the round's leader closed round ", v[0],
                              " where this replica ended round ", round);
    closing c;
    c.slowest_s = v[1];
    c.leader = leader_;
    const auto in = [&](int r) { return v[field(static_cast<std::size_t>(r), 0)]; };
    for (int r = 0; r < n; ++r)
      if (in(r) != 0) c.members.push_back(r);
    const double next = v[3];
    const auto member = [&](int r) { return std::binary_search(c.members.begin(), c.members.end(), r); };
    decentrain::detail::check(static_cast<double>(c.members.size()) == v[2] && member(leader_) && next >= 0 && next < n &&
                                  next == std::floor(next) && member(static_cast<int>(next)) && std::isfinite(c.slowest_s) &&
                                  c.slowest_s >= 0,
                              "diloco: the round's leader sent a malformed group");
    apply_group(d, v, n);
    leader_ = static_cast<int>(next);
    first_after_start_ = std::isfinite(v[4]) ? std::max(0.0, v[4]) : 0.0;
    c.in = member(me);
    return c;
  }
  // What every replica keeps of a group: the offsets (in one order everywhere) and the speeds.
  void apply_group(const round_deadline& d, const std::vector<double>& v, int n) {
    speeds_.assign(static_cast<std::size_t>(n), 0.0);
    for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
      const double s = v[field(r, 3)];
      speeds_[r] = std::isfinite(s) && s >= 0 ? s : 0.0;
    }
    for (int r = 0; r < n; ++r) {
      const double late = v[field(static_cast<std::size_t>(r), 2)];
      if (late >= 0 && std::isfinite(late)) remember(late, d.window);
    }
    for (int r = 0; r < n; ++r) {
      const double offset = v[field(static_cast<std::size_t>(r), 1)];
      if (v[field(static_cast<std::size_t>(r), 0)] != 0 && offset >= 0 && std::isfinite(offset)) remember(offset, d.window);
    }
  }

  template <class Comm>
  closing lead(const round_deadline& d, Comm& replicas, std::int64_t round, double planned_s) {
    auto& ep = replicas.endpoint();
    const int n = replicas.world(), me = replicas.rank();
    const double arrived_at = now_s(ep);
    std::vector<double> at(static_cast<std::size_t>(n), std::numeric_limits<double>::quiet_NaN());
    std::vector<double> late(static_cast<std::size_t>(n), -1.0);
    at[static_cast<std::size_t>(me)] = arrived_at;
    // The deadline counts from the first arrival of a replica that ran the round whole at its own
    // pace: one that went on partway into it (it came late to the round before and skipped
    // steps) comes as its estimate of the skip has it, early where that ran over, and one that
    // planned at a guessed pace (a joiner's first round) as the guess has it; either would close
    // the round on the others' normal time. Where only such replicas are in, from the first of them.
    std::vector<char> part(static_cast<std::size_t>(n), 0);
    part[static_cast<std::size_t>(me)] = part_ ? 1 : 0;
    const double none = std::numeric_limits<double>::infinity();
    double first_whole = part_ ? none : arrived_at, first_any = arrived_at;
    const auto anchor = [&] { return first_whole < none ? first_whole : first_any; };
    std::vector<int> pending;
    for (int r = 0; r < n; ++r)
      if (r != me) pending.push_back(r);
    const int quorum = d.quorum_of(n);
    const double deadline = deadline_s(d, n, planned_s);
    int in = 1;
    // An arrival taken (`exact`: when it arrived on this clock, where the transport knows it):
    // this round's, or one of an earlier round the group closed without it.
    auto take = [&](int source, const transport::bytes& m, double exact) {
      decentrain::detail::check(m.size() == arrival_fields * sizeof(double), "diloco: replica ", source, " sent an arrival of ",
                                m.size(), " bytes, where one is ", arrival_fields * sizeof(double));
      double v[arrival_fields];
      std::memcpy(v, m.data(), sizeof v);
      decentrain::detail::check(v[0] >= 0 && v[0] <= static_cast<double>(round) && v[0] == std::floor(v[0]), "diloco: replica ",
                                source, " came to round ", v[0], " where the group is at round ", round);
      decentrain::detail::check(std::isfinite(v[2]) && v[2] >= 0, "diloco: replica ", source, " sent a round of ", v[2],
                                " seconds");
      // (a speed or length out of reason is capped: it cannot stall the deadline's arithmetic)
      if (std::isfinite(v[1]) && v[1] > 0) speeds_[static_cast<std::size_t>(source)] = std::clamp(v[1], 1e-9, round_deadline::max_seconds);
      v[2] = std::min(v[2], round_deadline::max_seconds);
      const double when = std::isfinite(exact) ? exact : std::min(now_s(ep), start_ + v[2]);
      if (v[0] == static_cast<double>(round)) {
        at[static_cast<std::size_t>(source)] = when;
        part[static_cast<std::size_t>(source)] = v[3] != 0 ? 1 : 0;
        first_any = std::min(first_any, when);
        if (v[3] == 0) first_whole = std::min(first_whole, when);
        pending.erase(std::find(pending.begin(), pending.end(), source));
        ++in;
      } else if (v[0] == static_cast<double>(round - 1)) {  // late for the round before (its own round's length)
        late[static_cast<std::size_t>(source)] = std::max(0.0, v[2] - previous_first_after_start_);
        record_arrival({round - 1, source, v[2], false});
      }
    };
    while (!pending.empty()) {
      if (in >= quorum && std::isfinite(deadline)) {
        const double close_at = anchor() + deadline;
        bool took = false;
        for (const int r : std::vector<int>(pending))
          if (auto m = ep.try_recv(r, arrival_tag)) {
            take(r, *m, std::numeric_limits<double>::quiet_NaN());
            took = true;
          }
        const double t = now_s(ep);
        if (t >= close_at) break;  // (before anything else: arrivals that keep coming do not hold it open)
        if (took) continue;
        const double step = std::clamp(std::min(close_at - t, deadline / 50), 0.001, 1.0);
        transport::pause(ep, std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(step * 1000))));
      } else {
        auto m = ep.recv_any(std::span<const int>(pending), arrival_tag);
        // (the simulated arrival, where the transport knows it and its now() is that clock)
        const double clock = ep.stats().clock_seconds, t = now_s(ep), lag = clock - m.arrival_s;
        take(m.source, m.data,
             std::isfinite(lag) && std::abs(t - clock) < 1e-6 ? t - std::max(0.0, lag) : std::numeric_limits<double>::quiet_NaN());
      }
    }
    first_ = anchor();
    // The quorum's last arrival: the fastest quorum's time.
    std::vector<double> times;
    for (double a : at)
      if (!std::isnan(a)) times.push_back(a);
    std::sort(times.begin(), times.end());
    const double quorum_at = times[static_cast<std::size_t>(std::min<int>(quorum, static_cast<int>(times.size())) - 1)];
    closing c;
    c.in = true;
    c.leader = me;
    std::vector<double> group(group_size(n), 0.0);
    group[0] = static_cast<double>(round);
    double slowest = 0;
    for (double s : speeds_) slowest = std::max(slowest, s);
    c.slowest_s = group[1] = slowest;
    // The next round's leader: the member with the fewest seconds an inner step, whose fine steps
    // absorb a straggling one (the sizing fills its round to the deadline), so it comes on time
    // most often.
    int next = me;
    for (int r = 0; r < n; ++r) {
      const auto k = static_cast<std::size_t>(r);
      group[field(k, 2)] = late[k];
      group[field(k, 3)] = speeds_[k];
      const double a = at[k];
      if (std::isnan(a)) {
        ++dropped_;
        continue;
      }
      c.members.push_back(r);
      group[field(k, 0)] = 1;
      group[field(k, 1)] = part[k] ? -1.0 : a - first_;  // (a part's arrival is no offset of the round's)
      record_arrival({round, r, a - start_, true, part[k] != 0});
      const double s = speeds_[k], best = speeds_[static_cast<std::size_t>(next)];
      if (s > 0 && (!(best > 0) || s < best)) next = r;
    }
    group[2] = static_cast<double>(c.members.size());
    group[3] = next;
    group[4] = first_after_start_ = first_ - start_;
    apply_group(d, group, n);
    leader_ = next;
    for (int r = 0; r < n; ++r)
      if (r != me) ep.send(r, group_tag, std::as_bytes(std::span<const double>(group)));
    if (rounds_.size() >= max_records) rounds_.erase(rounds_.begin());
    rounds_.push_back({round, n, static_cast<int>(c.members.size()), first_ - start_, quorum_at - start_, now_s(ep) - start_,
                       arrived_at - start_, deadline});
    return c;
  }
  void remember(double offset, std::size_t window) {
    offsets_.push_back(std::clamp(offset, 0.0, round_deadline::max_seconds));
    while (offsets_.size() > window) offsets_.pop_front();
  }
  void record_arrival(const deadline_arrival& a) {
    if (arrivals_.size() >= max_records) arrivals_.erase(arrivals_.begin());
    arrivals_.push_back(a);
  }

  std::deque<double> offsets_;
  std::vector<double> speeds_;  // each replica's seconds per inner step as it last said
  std::vector<double> step_seconds_;  // this round's steps' seconds per inner step
  std::int64_t through_ = -1;         // the last step counted
  int leader_ = 0;  // this round's
  double start_ = 0, first_ = 0;  // this round's start and (leading) the deadline's anchor, on this clock
  bool part_ = false;             // this replica's arrival will be no measure of this round (see started)
  // The first arrival of the round (the one before), after its start on the leader's clock
  double first_after_start_ = 0, previous_first_after_start_ = 0;
  std::vector<deadline_round_record> rounds_;
  std::vector<deadline_arrival> arrivals_;
  std::int64_t missed_ = 0, dropped_ = 0;
};

}  // namespace decentrain::comm
