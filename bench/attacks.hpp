// Byzantine peers for bench/byzantine and the tests: a communication policy wrapped so that the
// highest `attackers` ranks send poison in place of what they computed, the rest unchanged.
// What is poisoned is what the policy sends: the gradient (sync_allreduce) or the round's
// pseudo-gradient, global - local (diloco, local_sgd: those with inner_steps). The attacks:
//   non-finite  all NaN (the first attacker) or all +inf (the second)
//   scaled      the honest value times `scale` (100)
//   sign-flip   the honest value negated
//   noise       the honest value plus Gaussian noise of `noise` (10) times its RMS per value
//   alie        "a little is enough" (Baruch et al. 2019): the honest peers' mean minus z (1)
//               times their standard deviation, per coordinate; the attackers see every honest
//               value of the round (the strongest form: they collude and know the others')
// In-process only: the peers share an attack_board (a barrier with a deadline) for alie.
#pragma once

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "decentrain/decentrain.hpp"

namespace bench {

enum class attack { none, non_finite, scaled, sign_flip, noise, alie };

inline const char* attack_name(attack a) {
  switch (a) {
    case attack::non_finite: return "non-finite";
    case attack::scaled: return "scaled";
    case attack::sign_flip: return "sign-flip";
    case attack::noise: return "noise";
    case attack::alie: return "alie";
    default: return "none";
  }
}
inline attack parse_attack(const std::string& s) {
  for (attack a : {attack::none, attack::non_finite, attack::scaled, attack::sign_flip, attack::noise, attack::alie})
    if (s == attack_name(a)) return a;
  decentrain::detail::fail("unknown attack '", s, "' (none, non-finite, scaled, sign-flip, noise, alie)");
}

// What the peers of one in-process run share: every peer posts its value, the attackers read.
// The barrier has a deadline: a peer that stopped (a failed run) ends the others' wait with an
// error naming it, instead of holding them for ever.
struct attack_board {
  explicit attack_board(int peers) : posted(static_cast<std::size_t>(peers)), peers_(peers) {}
  std::vector<std::vector<float>> posted;

  void arrive_and_wait(std::chrono::seconds within = std::chrono::seconds(60)) {
    std::unique_lock lock(mutex_);
    const std::uint64_t round = round_;
    if (++arrived_ == peers_) {
      arrived_ = 0;
      ++round_;
      changed_.notify_all();
      return;
    }
    if (!changed_.wait_for(lock, within, [&] { return round_ != round; }))
      decentrain::detail::fail("attack_board: ", peers_ - arrived_, " of ", peers_, " peers did not reach the round within ",
                               within.count(), " s (one stopped?)");
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int peers_, arrived_ = 0;
  std::uint64_t round_ = 0;
};

struct attack_settings {
  attack kind = attack::none;
  int attackers = 0;  // the highest ranks attack
  double scale = 100, noise = 10, z = 1;
  std::shared_ptr<attack_board> board;  // needed by alie
};

template <class Policy>
struct attacked {
  using policy_concept = decentrain::comm::policy_tag;
  static constexpr const char* name = Policy::name;
  static constexpr bool periodic = requires(Policy p) { p.inner_steps; };

  Policy inner{};
  attack_settings settings{};

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(settings.kind != attack::alie || settings.board, "attacked: alie needs an attack_board");
    // Who attacks is fixed at the start: a group that excludes an attacker (fault::elastic)
    // renumbers the others, who stay honest.
    const int n = ctx.replicas.world(), r = ctx.replicas.rank();
    attacker_ = r >= n - settings.attackers;
    first_ = (n - 1 - r) % 2 == 0;
    inner.start(ctx);
    if constexpr (periodic) decentrain::comm::gather_values(ctx.parameters, round_start_);
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    if constexpr (!periodic) {
      if (settings.kind != attack::none && ctx.replicas.world() > 1) {
        decentrain::comm::gather_grads(ctx.parameters, values_);
        poison(ctx, values_);
        decentrain::comm::scatter_grads(ctx.parameters, values_);
      }
    }
    inner.after_backward(ctx);
  }
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if constexpr (periodic) {
      const bool round = decentrain::comm::ends_round(ctx, inner.inner_steps);
      if (round && settings.kind != attack::none) {
        decentrain::comm::gather_values(ctx.parameters, values_);
        delta_.resize(values_.size());
        for (std::size_t i = 0; i < values_.size(); ++i) delta_[i] = round_start_[i] - values_[i];
        poison(ctx, delta_);
        for (std::size_t i = 0; i < values_.size(); ++i) values_[i] = round_start_[i] - delta_[i];
        decentrain::comm::scatter_values(ctx.parameters, values_);
      }
      inner.after_step(ctx);
      if (round) decentrain::comm::gather_values(ctx.parameters, round_start_);
    } else {
      inner.after_step(ctx);
    }
  }
  void save(decentrain::io::checkpoint& c) const { inner.save(c); }
  void load(const decentrain::io::checkpoint& c) { inner.load(c); }
  const auto& aggregation() const { return inner.aggregation(); }

 private:
  template <class Ctx>
  void poison(Ctx& ctx, std::vector<float>& v) {
    const int n = ctx.replicas.world(), r = ctx.replicas.rank();
    const bool attacker = attacker_;
    ++calls_;
    if (settings.kind == attack::alie) {
      auto& b = *settings.board;
      b.posted[static_cast<std::size_t>(r)] = v;
      b.arrive_and_wait();
      if (attacker) {
        const int honest = n - settings.attackers;
        for (std::size_t i = 0; i < v.size(); ++i) {
          double s = 0, s2 = 0;
          for (int p = 0; p < honest; ++p) {
            const double x = b.posted[static_cast<std::size_t>(p)][i];
            s += x;
            s2 += x * x;
          }
          const double m = s / honest, sd = std::sqrt(std::max(0.0, s2 / honest - m * m));
          v[i] = static_cast<float>(m - settings.z * sd);
        }
      }
      b.arrive_and_wait();  // nobody posts the next round before the attackers have read
      return;
    }
    if (!attacker) return;
    switch (settings.kind) {
      case attack::non_finite: {
        std::fill(v.begin(), v.end(), first_ ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity());
        break;
      }
      case attack::scaled:
        for (auto& x : v) x *= static_cast<float>(settings.scale);
        break;
      case attack::sign_flip:
        for (auto& x : v) x = -x;
        break;
      case attack::noise: {
        double s2 = 0;
        for (float x : v) s2 += static_cast<double>(x) * x;
        const double rms = v.empty() ? 0.0 : std::sqrt(s2 / static_cast<double>(v.size()));
        std::mt19937_64 gen(decentrain::detail::splitmix64(static_cast<std::uint64_t>(r) ^ (calls_ << 20)));
        std::normal_distribution<float> normal(0.0f, static_cast<float>(settings.noise * rms));
        for (auto& x : v) x += normal(gen);
        break;
      }
      default:
        break;
    }
  }
  std::vector<float> values_, delta_, round_start_;
  std::uint64_t calls_ = 0;
  bool attacker_ = false, first_ = false;  // first_: of the attackers, the one sending NaN (the other +inf)
};

}  // namespace bench
