// A member that lies at random (bench/attacks for 10 minutes, bench/RESULTS.md; 30 s in
// tests/fault/test_insiders.cpp): one of 4 TCP peers (threads of this process, 127.0.0.1,
// a run key) trains under fault::elastic like the others and, after each of its steps, sends the
// honest peers a burst of every message a member may send: membership messages of each kind
// (report, view, echo, ready, marker, hello), alarms, state offers and chunks, handoffs and data frames
// on the collectives' tags.
// About half are well-formed and in range (the view's epoch and members, sorted lists), the rest
// carry random fields or random bytes. Left out or excluded, it dials the group again as a
// joiner and goes on. The honest peers train until the time is up; none may stop, and they must
// end with the same parameters. The process's resident memory is sampled meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "decentrain/fault/handoff.hpp"
#include "decentrain/transport/tcp.hpp"
#include "resident_memory.hpp"

namespace bench::random_insider {

namespace dt = decentrain;

struct settings {
  std::chrono::seconds duration{30};
  std::uint64_t seed = 1;
  int burst = 24;  // messages the liar sends after each of its steps
};

struct outcome {
  std::vector<std::string> honest_errors;  // per honest peer (ranks 0-2): empty when it finished
  std::vector<std::vector<float>> honest_params;
  std::vector<std::int64_t> honest_steps;
  std::int64_t views = 0;  // view changes the first honest peer saw
  std::map<std::string, std::int64_t> sent;  // per message type
  std::int64_t well_formed = 0, random = 0;
  std::int64_t liar_returns = 0;  // times the liar came back as a joiner
  std::string liar_last_error;
  double rss_start_mb = 0, rss_peak_mb = 0;
  double seconds = 0;

  bool honest_equal() const {
    for (const auto& p : honest_params)
      if (p.empty() || p != honest_params.front()) return false;
    return true;
  }
  bool honest_finished() const {
    for (const auto& e : honest_errors)
      if (!e.empty()) return false;
    return true;
  }
};

inline double rss_mb() { return static_cast<double>(resident_bytes()) / (1024.0 * 1024.0); }

// The liar's messages: `well` ones in range of `current`, the others with random fields.
class liar {
 public:
  liar(std::uint64_t seed, outcome& out) : rng_(seed), out_(out) {}

  void burst(dt::transport::tcp& ep, const dt::fault::view& current, int n) {
    std::vector<int> honest;
    for (int j : current.members)
      if (j != ep.rank()) honest.push_back(j);
    if (honest.empty()) return;
    for (int i = 0; i < n; ++i) {
      const int to = honest[pick(honest.size())];
      const bool well = (sent_++ % 2) == 0;  // half well-formed, exactly
      try {
        send_one(ep, to, current, well);
      } catch (const std::exception&) {
        // the connection was closed on it (what it sent got it dropped): the next burst finds out
      }
    }
  }

 private:
  std::size_t pick(std::size_t n) { return static_cast<std::size_t>(rng_() % n); }
  bool coin() { return (rng_() & 1u) != 0; }
  std::int32_t any_rank() { return static_cast<std::int32_t>(rng_()); }
  std::vector<std::int32_t> members_subset(const dt::fault::view& v) {
    std::vector<std::int32_t> out;
    for (int j : v.members)
      if (coin()) out.push_back(j);
    return out;
  }
  std::vector<std::int32_t> random_list() {
    std::vector<std::int32_t> out(pick(6));
    for (auto& r : out) r = coin() ? static_cast<std::int32_t>(pick(8)) - 2 : any_rank();
    return out;
  }
  dt::transport::bytes random_bytes(std::size_t most) {
    dt::transport::bytes b(pick(most + 1));
    for (auto& x : b) x = static_cast<std::byte>(rng_());
    return b;
  }
  void count(const std::string& what, bool well) {
    ++out_.sent[what];
    ++(well ? out_.well_formed : out_.random);
  }

  void send_one(dt::transport::tcp& ep, int to, const dt::fault::view& current, bool well) {
    namespace fd = dt::fault::detail;
    const auto send = [&](dt::transport::tag_type tag, const dt::transport::bytes& b) {
      ep.send(to, tag, std::span<const std::byte>(b.data(), b.size()));
    };
    switch (pick(9)) {
      case 0: case 1: case 2: case 3: case 4: {  // membership: report, view, marker, hello, echo, ready
        fd::message m;
        static constexpr const char* names[] = {"report", "view", "marker", "hello", "echo", "ready"};
        const auto k = 1 + pick(6);
        m.what = static_cast<fd::kind>(k);
        if (well) {
          m.epoch = current.epoch + (m.what == fd::kind::report ? 0 : 1);
          m.step = static_cast<std::int64_t>(pick(100));
          m.phase = static_cast<std::int8_t>(pick(5));
          m.donor = current.members[pick(current.members.size())];
          m.ranks = m.what == fd::kind::report ? std::vector<std::int32_t>{} : members_subset(current);
          if ((m.what == fd::kind::view || m.what == fd::kind::ready) && m.ranks.empty()) m.ranks = {m.donor};
          m.digest = rng_();
        } else {
          if (coin()) m.what = static_cast<fd::kind>(pick(256));
          m.epoch = coin() ? rng_() : current.epoch + pick(3);
          m.step = static_cast<std::int64_t>(rng_());
          m.phase = static_cast<std::int8_t>(rng_());
          m.donor = any_rank();
          m.ranks = random_list();
          m.departed = random_list();
          m.behind = random_list();
          m.convicted = random_list();
          m.digest = rng_();
        }
        if (!well && pick(4) == 0) send(fd::protocol_tag, random_bytes(512));
        else fd::post(ep, to, m);
        count(std::string("membership ") + names[k - 1], well);
        break;
      }
      case 5: {  // an alarm: rarely (each starts an agreement), of this view or another
        if (pick(8) != 0) return send_one(ep, to, current, well);
        const auto b = well ? dt::transport::wire::encode_alarm(current.epoch, current.members[pick(current.members.size())])
                            : dt::transport::wire::encode_alarm(rng_(), any_rank());
        ep.send(to, dt::transport::alarm_tag, std::span<const std::byte>(b.data(), b.size()));
        count("alarm", well);
        break;
      }
      case 6: {  // a state offer or chunk, out of any transfer
        send(fd::state_tag, random_bytes(well ? 256 : 4096));
        count("state", well);
        break;
      }
      case 7: {  // a handoff, out of any leave
        send(dt::fault::handoff_tag, random_bytes(well ? 256 : 4096));
        count("handoff", well);
        break;
      }
      default: {  // a data frame: on a low tag (where the collectives' are) or any
        const dt::transport::tag_type tag = well ? pick(64) : rng_() & 0x7fffffffffffull;
        send(tag, random_bytes(well ? 1024 : 8192));
        count("data", well);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  outcome& out_;
  std::uint64_t sent_ = 0;
};

// Runs the scenario: peers 0-2 honest, peer 3 the liar, a tiny GPT on `data` (sync all-reduce,
// median aggregator), until `s.duration` has passed.
template <class Comm>
outcome run(const dt::nn::gpt_config& model, const dt::data::token_dataset& data, const settings& s) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm, dt::parallel::data, dt::fault::elastic>;
  constexpr int world = 4, liar_rank = 3;
  outcome out;
  out.honest_errors.resize(world - 1);
  out.honest_params.resize(world - 1);
  out.honest_steps.resize(world - 1);
  dt::train::trainer_options opts;
  opts.steps = 1'000'000;  // until the time is up
  opts.batch_size = 2;
  opts.eval_batches = 1;
  opts.eval_every = 0;
  opts.stop_check_every = 1;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::seconds(3);
  fault.agreement.patience = std::chrono::seconds(60);
  dt::transport::tcp_options base;
  base.world = world;
  base.max_world = 8;
  base.key = "a run key shared by the four peers, the liar included";
  base.recv_timeout = std::chrono::seconds(20);
  base.join_timeout = std::chrono::seconds(10);
  base.min_silence = std::chrono::seconds(3);
  dt::transport::tcp first(base);
  const std::string seed_address = first.address();
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + s.duration;
  out.rss_start_mb = rss_mb();
  std::atomic<bool> done{false};
  std::atomic<double> peak{out.rss_start_mb};
  std::thread sampler([&] {
    while (!done) {
      const double r = rss_mb();
      if (r > peak) peak = r;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::mutex m;
  auto honest = [&](int r, std::optional<dt::transport::tcp> pre) {
    const auto i = static_cast<std::size_t>(r);
    try {
      auto o = base;
      o.rank = r;
      o.join = {seed_address};
      dt::transport::tcp ep = pre ? std::move(*pre) : dt::transport::tcp(o);
      ep.connect();
      Trainer t(model, opts, ep, Comm{}, {}, fault);
      t.stop_when([&] { return std::chrono::steady_clock::now() >= deadline; });
      const auto result = t.fit(data);
      std::lock_guard lock(m);
      dt::comm::gather_values(t.model().parameters(), out.honest_params[i]);
      out.honest_steps[i] = result.last.step;
      if (r == 0) out.views = static_cast<std::int64_t>(t.fault().change_count());
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      out.honest_errors[i] = e.what();
    }
  };
  auto lying = [&] {
    liar l(s.seed, out);
    auto o = base;
    o.rank = liar_rank;
    o.join = {seed_address};
    for (bool again = false; std::chrono::steady_clock::now() < deadline; again = true) {
      try {
        if (again) {
          std::lock_guard lock(m);
          ++out.liar_returns;
        }
        dt::transport::tcp ep(o);
        ep.connect();
        Trainer t(model, opts, ep, Comm{}, {}, fault);
        t.stop_when([&] { return std::chrono::steady_clock::now() >= deadline; });
        t.on_step([&](const dt::train::step_metrics&) {
          std::lock_guard lock(m);
          l.burst(ep, t.fault().current(), s.burst);
        });
        t.fit(data);
        return;
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        out.liar_last_error = e.what();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(honest, 0, std::move(first));
  for (int r = 1; r < liar_rank; ++r) threads.emplace_back(honest, r, std::nullopt);
  threads.emplace_back(lying);
  for (auto& t : threads) t.join();
  done = true;
  sampler.join();
  out.rss_peak_mb = peak;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace bench::random_insider
