// DiLoCo (Douillard et al., 2023): each peer runs H = inner_steps inner optimizer steps from the
// shared global parameters; then the pseudo-gradient (global - local) is averaged across the
// replicas (sent through Codec, combined by Aggregator) and applied to the global parameters by an outer optimizer,
// Nesterov momentum by default (lr 0.7, momentum 0.9, the paper's settings), and every peer
// starts the next round from the new global parameters. Peers talk once per H steps instead of
// every step. The average is one all-reduce among all the replicas, or Moshpit's rounds in small
// groups (`moshpit`: comm/moshpit.hpp), so that no collective spans every replica, or the
// two-level all-reduce over sites (`site`: collective/two_level_all_reduce.hpp), so that each
// byte crosses between sites once per step of the collective across them, carried by every
// member of a site in equal parts.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/comm/auto_tuning.hpp"
#include "decentrain/comm/link_probe.hpp"
#include "decentrain/comm/moshpit.hpp"
#include "decentrain/comm/outer.hpp"
#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/ring_ordering.hpp"
#include "decentrain/comm/round_deadline.hpp"
#include "decentrain/comm/site_averaging.hpp"

namespace decentrain::comm {


template <class Outer = outer::nesterov, class Codec = compress::identity, class Aggregator = collective::mean>
struct diloco {
  static_assert(outer::check_outer<Outer>());
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "diloco";

  std::int64_t inner_steps = 50;  // H: inner steps per round
  Outer outer_optimizer{};
  Codec codec{};
  Aggregator aggregator{};
  // Average the replicas' pseudo-gradients by the weight of their rounds (the sum of
  // ctx.step_weight over the round's steps: the rows each took, say) instead of equally
  // (collective::encoded_all_reduce: the mean scales, a robust aggregator weighs). Every replica the same.
  bool weighted = false;
  // Work sized to speed (DyLU: Liu et al., 2024, "Asynchronous Local-SGD Training for Language
  // Modeling"): a replica takes as many inner steps as fit in the time the slowest needs for
  // inner_steps (about H_i = H s_slowest / s_i, s being the compute seconds an inner step took it, the
  // slowest's agreed by one 8-byte all-reduce a round; the first round sized after its first
  // step), spread over the round's steps and made up as it goes (speed_sizing), and its
  // pseudo-gradient weighs by the rows it trained (as `weighted`). Every replica's round then
  // takes about as long, so none waits for the slowest. Every replica the same; not with
  // `moshpit` (the speeds' all-reduce would span every replica).
  bool sized_to_speed = false;
  // Sized to speed (or tuned): each round's deadline is the slowest replica's measured time for
  // it and this share more, so that a round the slowest computes slower than measured (compute
  // on a clock wanders a few percent from round to round: cores shared, caches, frequency) still
  // ends by the deadline. The slowest replica cannot take less than one inner step a step, and
  // every replica waits for it at the round's end; with the margin it fills the round as the
  // others do (an inner step more now and then). 0: the measured time (exact where compute is,
  // as on a simulated clock). In [0, 1]; every replica the same.
  double headroom = 0.05;
  // Set: H and the codec are picked from measures (comm/auto_tuning.hpp: the links probed at the
  // start and timed at each exchange, the slowest replica's compute), first after step 0, then
  // again whenever a round's measures drift; `inner_steps` is the H until the first pick. Work
  // is sized to speed as with sized_to_speed (which measures the compute). Every replica the
  // same; not with `moshpit`.
  std::optional<auto_tuning<Codec>> tune{};
  // Set: the pseudo-gradients are averaged by this grid's Moshpit rounds (exact for n = M^d with
  // its default rounds) instead of one all-reduce; every replica the same.
  std::optional<moshpit_grid> moshpit{};
  // This replica's site (a datacenter, a machine; 1 to 63 bytes), or "auto" on every replica:
  // the sites found from the round trips the replicas measure (collective::sites_by_latency).
  // Set, the replicas agree on everyone's at the first exchange and after each new view, and the pseudo-gradients are
  // averaged by the two-level all-reduce: summed inside each site, each member of a site
  // reducing its 1/k of them with its counterparts of the other sites (through Codec), and the
  // result shared inside the site. Every replica names a site or none does; with the mean
  // aggregator and a dense codec, not weighted, sized to speed, tuned nor with Moshpit.
  std::string site{};
  // With a site: the inner steps' gradients are also averaged inside the site at every step
  // (f32, one all-reduce among its members), so that a site trains as one data-parallel replica
  // and only the outer average crosses between sites (INTELLECT-1's shape). The sites then
  // weigh in the outer average by their members.
  bool sync_inside_site = false;
  // Set: the ring of the all-reduce follows the replicas' measured links (comm/ring_ordering.hpp),
  // measured before the first exchange (with tune, before its probe), after each new view, and
  // with tune after each pick that the links' drift brought.
  // Every replica the same; not with `site` or `moshpit` (they are no ring of every replica).
  std::optional<measured_ring> ring{};
  // Set: a round closes at a deadline its replicas' arrivals set, once a quorum is in, and goes
  // on without the replicas that come later (comm/round_deadline.hpp): they take the group's
  // average from the round's leader and skip the steps the group took meanwhile. Needs
  // sized_to_speed (the leader hands out the slowest replica's speed); not with tune, moshpit, a
  // site or ring. Every replica the same.
  std::optional<round_deadline> deadline{};
  // Its state laid out over the parameters (flat tensors of save(), in parameter order): a
  // pipeline's re-deal moves each parameter's share with the parameter (train/redeal.hpp).
  static constexpr std::array<const char*, 2> per_parameter_state = {"comm.diloco.global", "comm.diloco.momentum"};

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(inner_steps >= 1, "diloco: inner_steps must be >= 1, got ", inner_steps);
    decentrain::detail::check(!(sizes() && moshpit), "diloco: ", tune ? "tune" : "sized_to_speed", " needs one all-reduce ",
                              "of the replicas' speeds a round, which Moshpit's averaging is there to avoid: set one of them");
    decentrain::detail::check(headroom >= 0 && headroom <= 1, "diloco: headroom must be in [0, 1], got ", headroom);
    speed_.headroom = headroom;
    outer::validate(outer_optimizer, "diloco");
    if (moshpit) moshpit->validate("diloco");
    if (tune) tune->validate("diloco");
    if (deadline) {
      deadline->validate("diloco");
      decentrain::detail::check(sized_to_speed && !tune && !moshpit && site.empty() && !ring, "diloco: a deadline ",
                                "needs sized_to_speed, and not tune, moshpit, a site or ring (the leader of each round ",
                                "sizes the next from the speeds the replicas bring)");
    }
    if (ring) {
      ring->validate("diloco");
      decentrain::detail::check(site.empty() && !moshpit, "diloco: ring orders the all-reduce of every replica, and with ",
                                moshpit ? "moshpit" : "a site", " there is none: set one of them");
    }
    decentrain::detail::check(!sync_inside_site || !site.empty(), "diloco: sync_inside_site averages the gradients inside ",
                              "this replica's site, and it names none (set site)");
    if (!site.empty())
      site_averaging<Codec>::check(site, codec, aggregator, "diloco",
                                   moshpit ? "moshpit" : tune ? "tune" : sized_to_speed ? "sized_to_speed" : weighted ? "weighted" : "");
    sites_.forget();
    if (!site.empty()) sites_.keep_fresh(codec);  // (a resumed one: load() kept it)
    prepare_codec(codec, aggregator, ctx,
                  (moshpit ? ", averaged by " + moshpit->describe() : std::string()) + (tune ? ", " + tune->describe() : std::string()) +
                      (site.empty() ? std::string() : std::string(", averaged over sites")) +
                      (sync_inside_site ? std::string(", synchronous inside each") : std::string()) +
                      (ring ? ", " + ring->describe() : std::string()) +
                      (deadline ? ", " + deadline->describe() : std::string()));
    check_weighs(aggregator, weighs(), "diloco");
    if (tune) {  // the codecs it may pick, priced (and picked) with the parameters' shapes
      layout_ = layout_of(ctx.parameters);
      for (auto& c : tune->codecs) compress::set_layout(c, layout_);
    }
    // (restored or taken mid-round: this replica runs the rest of it, no whole round's measure)
    deadlines_.started(ctx.replicas, ctx.resumed && ctx.step % inner_steps != 0);
    go_on_at_ = 0;
    if (ctx.resumed) {  // restored: local parameters may be mid-round, the global ones came with the state
      decentrain::detail::check(global_.size() == flat_size(ctx.parameters), "diloco: restored state has ", global_.size(),
                                " values, the model has ", flat_size(ctx.parameters));
      // Tuned from a state that was not (an untuned run resumed with tune): the group probes now
      // (every replica restored the same state; a joiner takes the members' tuned state).
      if (tune && !tuned_state_ && !ctx.joined) probe(ctx);
      return;
    }
    broadcast_parameters(ctx, global_);
    momentum_.assign(global_.size(), 0.0f);
    momentum_started_ = false;
    speed_.reset();
    round_from_ = 0;
    choices_.clear();
    codec_at_ = own_codec;
    if (tune) probe(ctx);
  }
  // Before the fault policy starts: the outer state at the model's size (values set by start or
  // by a state loaded), so that a state a joiner takes from the members lands in it rather than
  // in new memory (fault::elastic). A state restored already keeps its size (start checks it).
  template <class Ctx>
  void size_state(Ctx& ctx) {
    if (!global_.empty()) return;
    global_.resize(flat_size(ctx.parameters));
    momentum_.resize(global_.size());
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    if (!sync_inside_site) return;
    auto& inside = sites_.levels(ctx, site, codec, global_.size()).site();
    if (inside.world() == 1) return;
    gather_grads(ctx.parameters, grads_);
    inside.all_reduce(std::span<float>(grads_), collective::reduce_op::average);
    scatter_grads(ctx.parameters, grads_);
  }

  // Inner steps this replica takes in `step` (the trainer asks): 1, or under sized_to_speed its
  // share of the inner steps that fit before the round's deadline (speed_sizing).
  std::int64_t local_steps(std::int64_t step) const { return sizes() ? speed_.share(steps_left(step)) : 1; }

  template <class Ctx>
  void after_step(Ctx& ctx) {
    weight_.add(ctx);
    if (deadline) deadlines_.add_step(ctx.step, ctx.step_compute_s, ctx.local_steps);
    const bool ends = ends_round_at(ctx.step) || ctx.last_step;
    if (sizes()) {
      speed_.add(ctx);
      // Not measured yet (a run's first step): the rest of the first round is sized at once,
      // and a tuned policy picks its settings.
      if (speed_.round_steps == 0 && !ends) {
        speed_.next_round(ctx, inner_steps, steps_left(ctx.step) - 1);
        if (tune && choices_.empty() && speed_.agreed && speed_.slowest_s > 0) {
          // Mid-round (step 0, or an untuned state resumed): the round keeps its start under
          // the H it had, and has at least this step's successor left.
          if (round_from_ == 0) round_from_ = ctx.step - ctx.step % inner_steps;
          pick(ctx, {speed_.slowest_s, link_.fixed_s, link_.per_byte_s}, "start");
          round_from_ = std::max(round_from_, ctx.step + 2 - inner_steps);
          speed_.set_round(inner_steps, steps_left(ctx.step) - 1);
        }
      }
    }
    if (!ends) return;
    gather_values(ctx.parameters, delta_);
    for (std::size_t i = 0; i < delta_.size(); ++i) delta_[i] = global_[i] - delta_[i];  // pseudo-gradient
    compress::set_reference(codec, std::span<const float>(global_), ctx.lr_scale);  // for a significance filter
    double exchange_s = 0;  // on this replica's clock
    if (!site.empty()) {
      const double t0 = ctx.replicas.endpoint().stats().clock_seconds;
      sites_.average(ctx, site, codec, aggregator, aggregation_, std::span<float>(delta_), sync_inside_site);
      exchange_s = ctx.replicas.endpoint().stats().clock_seconds - t0;
    } else if (deadline) {
      return end_round_by_deadline(ctx);
    } else if (moshpit) {
      std::optional<double> w = weight_if(weighs(), weight_.sum);
      averager_.average(*moshpit, codec, aggregator, ctx.replicas, std::span<float>(delta_),
                        rounds_ * moshpit->rounds_per_average(ctx.replicas.world()), w);
    } else {
      if (ring) ordering_.order(ctx, *ring, codec, delta_.size());
      const double t0 = ctx.replicas.endpoint().stats().clock_seconds;
      collective::encoded_all_reduce(codec, ctx.replicas, std::span<float>(delta_), true, aggregator, aggregation_,
                                     weight_if(weighs(), weight_.sum));
      exchange_s = ctx.replicas.endpoint().stats().clock_seconds - t0;
    }
    if (tune) {
      // The exchange as the replica that waited longest for it saw it (those that reached it
      // first also waited for the others: what a round costs the least busy replica), agreed
      // beside the speeds.
      double longest = exchange_s;
      speed_.next_round(ctx, inner_steps, inner_steps, std::span<double>(&longest, 1));
      retune(ctx, std::isfinite(longest) ? std::max(0.0, longest) : 0.0);
      round_from_ = ctx.step + 1;
      speed_.set_round(inner_steps, inner_steps);
    } else if (sized_to_speed) {
      speed_.next_round(ctx, inner_steps, inner_steps);
    }
    outer::step(outer_optimizer, global_, delta_, momentum_, !momentum_started_);
    momentum_started_ = true;
    scatter_values(ctx.parameters, global_);
    ++rounds_;
    weight_.sum = 0;
  }

  // Tuned, H changes at rounds' ends: a round ends H steps after the one that started it.
  bool ends_round_at(std::int64_t step) const {
    if (!tune) return ends_round(step, inner_steps);
    return step + 1 == round_from_ || (step >= round_from_ && (step + 1 - round_from_) % inner_steps == 0);
  }
  // A re-formed view: Moshpit's groups and the sites' are other peers.
  void drop_in_flight() {
    averager_.forget();
    sites_.forget();
    deadlines_.forget_view();
  }
  // With a deadline: the step this replica goes on from after a round the group closed without
  // it, where the group is (the trainer asks after each step; 0: go on as usual).
  std::int64_t catch_up() { return std::exchange(go_on_at_, 0); }
  // Whether it may skip steps (catch_up): the replicas then pass a round's start apart, and a
  // fault policy does not meet there (fault::elastic).
  bool catches_up() const { return deadline.has_value(); }
  // With a deadline: the rounds as the leader closed them, the arrivals, the rounds missed.
  const deadline_rounds& deadlines() const { return deadlines_; }
  std::int64_t rounds() const { return rounds_; }
  // What each replica's pseudo-gradients looked like: dropped (non-finite, malformed) or far away.
  const collective::aggregation_record& aggregation() const { return aggregation_; }

  void save(io::checkpoint& c) const {
    c.tensors["comm.diloco.global"] = flat_tensor(global_, c);
    c.tensors["comm.diloco.momentum"] = flat_tensor(momentum_, c);
    c.counters["comm.diloco.momentum_started"] = momentum_started_ ? 1 : 0;
    c.counters["comm.diloco.rounds"] = rounds_;
    save_codec(codec, c, "comm.diloco.codec.");
    sites_.save(c, "comm.diloco.");
    weight_.save(c, "comm.diloco.");
    if (deadline) deadlines_.save(c, "comm.diloco.");
    if (sizes()) speed_.save(c, "comm.diloco.");
    if (tune) {
      c.counters["comm.diloco.tune.inner_steps"] = inner_steps;
      c.counters["comm.diloco.tune.round_from"] = round_from_;
      c.counters["comm.diloco.tune.codec"] = codec_at_ == own_codec ? -1 : static_cast<std::int64_t>(codec_at_);
      c.text["comm.diloco.tune.codec_name"] = compress::describe(codec);
      c.counters["comm.diloco.tune.picks"] = static_cast<std::int64_t>(choices_.size());
      save_measure(c, "comm.diloco.tune.link.", link_);
      save_exact(c, "comm.diloco.tune.small_s", small_s_);
      save_measure(c, "comm.diloco.tune.basis.", basis_);
      save_measure(c, "comm.diloco.tune.recent.", recent_);
    }
  }
  void load(const io::checkpoint& c) {
    const auto n = static_cast<std::size_t>(c.tensor_at("comm.diloco.global").numel());
    load_flat(c, "comm.diloco.global", global_, n);
    load_flat(c, "comm.diloco.momentum", momentum_, n);
    momentum_started_ = c.counter("comm.diloco.momentum_started") != 0;
    rounds_ = c.counter("comm.diloco.rounds");
    const bool tuned = c.counters.contains("comm.diloco.tune.inner_steps");
    if (tuned && !tune)
      decentrain::detail::fail("checkpoint: written by a DiLoCo that picked its own H and codec (H ",
                               c.counter("comm.diloco.tune.inner_steps"), " when saved); resume it with tune set (--auto)");
    tuned_state_ = tuned;
    if (tuned) {  // (before the codec's state: the codec picked)
      inner_steps = c.counter("comm.diloco.tune.inner_steps");
      round_from_ = c.counter("comm.diloco.tune.round_from");
      const auto at = c.counter("comm.diloco.tune.codec");
      const auto picks = static_cast<std::int64_t>(tune->codecs.size());
      decentrain::detail::check(inner_steps >= 1 && round_from_ >= 0 && at >= -1 && at < std::max<std::int64_t>(picks, 1),
                                "checkpoint: diloco's tuned settings (H ", inner_steps, ", round from step ", round_from_,
                                ", codec ", at, " of ", picks, ") do not fit this policy's tune");
      const auto saved_name = c.text.find("comm.diloco.tune.codec_name");
      if (at >= 0 && picks > 0) {
        decentrain::detail::check(saved_name == c.text.end() || saved_name->second == compress::describe(tune->codecs[static_cast<std::size_t>(at)]),
                                  "checkpoint: diloco picked codec ", at, ", '", saved_name == c.text.end() ? "" : saved_name->second,
                                  "', where this policy's tune has '", compress::describe(tune->codecs[static_cast<std::size_t>(at)]),
                                  "' (its codecs must be the same, in the same order)");
        if (static_cast<std::size_t>(at) != codec_at_) {  // (a live policy loading mid-run keeps its codec's layout)
          codec = tune->codecs[static_cast<std::size_t>(at)];
          if (!layout_.empty()) compress::set_layout(codec, layout_);
        }
      }
      codec_at_ = at < 0 ? own_codec : static_cast<std::size_t>(at);
      link_ = load_measure(c, "comm.diloco.tune.link.");
      small_s_ = load_exact(c, "comm.diloco.tune.small_s", "a number of seconds").value_or(0.0);
      basis_ = load_measure(c, "comm.diloco.tune.basis.");
      recent_ = load_measure(c, "comm.diloco.tune.recent.");
      // The picks made before are not in the checkpoint; placeholders keep their count (the
      // first pick is not made again), and a live policy loading mid-run keeps its own.
      const auto count = static_cast<std::size_t>(std::max<std::int64_t>(0, c.counter("comm.diloco.tune.picks")));
      if (choices_.size() < count) choices_.resize(count, tuning_choice{});
    }
    if (!site.empty()) sites_.keep_fresh(codec);  // (before its state is loaded)
    sites_.load(c, "comm.diloco.");
    load_codec(codec, c, "comm.diloco.codec.");
    weight_.load(c, "comm.diloco.");
    deadlines_.load(c, "comm.diloco.");
    if (sizes()) speed_.load(c, "comm.diloco.");  // (another replica's state: at this one's own pace)
    else speed_.reset();
  }
  // This round's inner steps on this replica as planned when sized (sized_to_speed; inner_steps
  // until it measured).
  std::int64_t round_inner_steps() const { return std::max(inner_steps, speed_.round_steps); }
  // With a site: the sites of the group's last exchange (named, or found by their round trips
  // with "auto"); none before the first.
  std::optional<collective::site_map> sites() const { return sites_.sites(); }
  // Tuned: every pick so far, the first after step 0 (a resumed run's earlier ones are
  // placeholders with step -1).
  const std::vector<tuning_choice>& choices() const { return choices_; }
  // With ring: the orders measured so far (ordering().last(): the last, and what it came from).
  const ring_ordering& ordering() const { return ordering_; }

 private:
  std::vector<float> global_, momentum_, delta_, grads_;
  bool momentum_started_ = false;
  std::int64_t rounds_ = 0;
  bool weighs() const { return weighted || sizes(); }
  bool sizes() const { return sized_to_speed || tune.has_value(); }
  // Steps of the round from `step` on, `step` included.
  std::int64_t steps_left(std::int64_t step) const {
    return tune ? round_from_ + inner_steps - step : inner_steps - step % inner_steps;
  }
  // The start's probe of the replicas' links.
  template <class Ctx>
  void probe(Ctx& ctx) {
    if (ring) ordering_.order(ctx, *ring, codec, global_.size());  // (the probe's rings too)
    const auto probed = probe_links(ctx.replicas, global_.size(), tune->probe_values, probing::time_recursive_doubling::no);
    link_ = probed.link;
    small_s_ = probed.small_s;
  }
  // Sets H and the codec from measures `m` (the same on every replica), and keeps the pick.
  template <class Ctx>
  void pick(Ctx& ctx, const tuning_measure& m, std::string why) {
    auto c = tune->choose(m, global_.size(), ctx.replicas.world(), codec, ctx.run_steps);
    c.step = ctx.step;
    c.why = std::move(why);
    // Every replica must have picked alike (the same measures, one pure function; a build that
    // rounds otherwise would split the run): one 16-byte comparison a pick.
    const auto settings = std::to_string(c.inner_steps) + " inner steps, codec " + c.codec_name;
    decentrain::detail::check(ctx.replicas.all_same(decentrain::detail::fnv1a(settings)), "diloco: the replicas picked ",
                              "different settings after step ", ctx.step, " (this one: ", settings, ")");
    inner_steps = c.inner_steps;
    if (!tune->codecs.empty() && c.codec != codec_at_) codec = tune->codecs[c.codec];  // (its layout set at the start)
    codec_at_ = tune->codecs.empty() ? own_codec : c.codec;
    basis_ = recent_ = m;
    choices_.push_back(std::move(c));
  }
  // At a round's end: the round's measures, the agreed slowest compute, and the link's model
  // scaled to what the round's exchange (and its small all-reduce) took, against what the model
  // predicted for the codec in use (the probe's model before the first pick); picked again where
  // they drifted.
  template <class Ctx>
  void retune(Ctx& ctx, double exchange_s) {
    // Nothing measured (no compute clock), or a peer's figure not a number; or the run ends.
    if (!speed_.agreed || !(speed_.slowest_s > 0) || ctx.last_step) return;
    const tuning_measure& model = choices_.empty() ? link_ : basis_;
    const double bytes = exchange_bytes(codec, global_.size(), ctx.replicas.world());
    const double took = exchange_s + small_s_, predicted = model.fixed_s + model.per_byte_s * bytes;
    tuning_measure now{speed_.slowest_s, took, 0.0};
    if (predicted > 0) now = {speed_.slowest_s, model.fixed_s * took / predicted, model.per_byte_s * took / predicted};
    if (choices_.empty()) return pick(ctx, now, "start");
    recent_ = tune->smoothed(recent_, now);
    // (an exchange within the round's allowance, (1 - busy) / busy of its compute, plus one of
    // the slowest replica's inner steps, drifts only relative to that: the replicas sized to
    // speed reach the exchange up to about an inner step apart, and that noise of a fast link
    // picks nothing again)
    const double allowance = (1 - tune->busy) / tune->busy * static_cast<double>(inner_steps) * basis_.step_s + basis_.step_s;
    const auto [off, what] = auto_tuning<Codec>::drift_of(recent_, basis_, bytes, allowance);
    if (off > tune->drift) {
      pick(ctx, recent_, std::string("drift: ") + what + " " + std::to_string(std::lround(100 * off)) + "% off");
      if (ring && std::string_view(what) == "link") ordering_.again(ctx);  // (the links changed: so may the best ring)
    }
  }

  // A round's end with a deadline: the group the leader closed averages; a replica that came
  // too late takes the average (and any later round's the leader closed meanwhile) and skips ahead.
  template <class Ctx>
  void end_round_by_deadline(Ctx& ctx) {
    const double overrun = speed_.compute_s - speed_.deadline_s;  // compute past the round's plan
    // This replica's typical inner step, a straggling one left out, goes to the leader (0: none
    // measured, as after taking a state at the round's end: the leader keeps no speed for it), and
    // plans its next round (unmeasured: at the pace it took with the state, a guess).
    const double own = deadlines_.typical_step_s() > 0 ? deadlines_.typical_step_s() : speed_.seconds_per_step();
    const double typical = own > 0 ? own : speed_.pace();
    const auto group = deadlines_.close(*deadline, ctx.replicas, rounds_, own, speed_.deadline_s, delta_.size() * sizeof(float));
    std::int64_t behind = 0;  // whole rounds the group closed without this replica
    if (group.in) {
      std::optional<double> w = weight_if(weighs(), weight_.sum);
      if (group.members.size() < static_cast<std::size_t>(ctx.replicas.world())) {
        // (a group of the round's members, made anew each round: every member makes it once;
        // its tally counts the group's ranks, not the replicas', and is not kept)
        auto members = ctx.replicas.group(group.members);
        collective::aggregation_record by_group;
        collective::encoded_all_reduce(codec, members, std::span<float>(delta_), true, aggregator, by_group, w);
      } else {
        collective::encoded_all_reduce(codec, ctx.replicas, std::span<float>(delta_), true, aggregator, aggregation_, w);
      }
      deadlines_.send_result(ctx.replicas, group, std::span<const float>(delta_));
    } else {
      deadlines_.take_result(ctx.replicas, group, std::span<float>(delta_));
    }
    double slowest = group.slowest_s;
    const bool missed = !group.in;
    for (;;) {
      outer::step(outer_optimizer, global_, delta_, momentum_, !momentum_started_);
      momentum_started_ = true;
      ++rounds_;
      if (!missed || ctx.last_step) break;
      auto later = deadlines_.next_closed(*deadline, ctx.replicas, rounds_);
      if (!later) break;
      deadlines_.take_result(ctx.replicas, *later, std::span<float>(delta_));
      slowest = later->slowest_s;
      ++behind;
    }
    // Where the group is now: in round rounds_ (the rounds taken above), as many steps into it as
    // this replica's compute past the plan makes, in the slowest replica's inner steps (the
    // group's pace), less the whole rounds taken; the next round's deadline then covers the steps
    // left. After the run's last round: at its end.
    std::int64_t within = 0;
    if (missed && slowest > 0 && overrun > 0)
      within = std::clamp<std::int64_t>(static_cast<std::int64_t>(overrun / slowest) - behind * inner_steps, 0, inner_steps - 1);
    go_on_at_ = 0;
    if (missed && !ctx.last_step) {
      const std::int64_t from = rounds_ * inner_steps;  // (where the group's round starts)
      // (this replica ends that round itself: the run's last one may be shorter)
      go_on_at_ = from >= ctx.run_steps ? ctx.run_steps : std::min(from + within, std::min(from + inner_steps, ctx.run_steps) - 1);
    }
    speed_.next_round_from(slowest, typical, inner_steps, inner_steps - within);
    scatter_values(ctx.parameters, global_);
    weight_.sum = 0;
    // (a round planned at a guessed pace is no measure of a round either)
    deadlines_.started(ctx.replicas, within > 0 || !(own > 0));
  }

  round_weight weight_;
  speed_sizing speed_;
  deadline_rounds deadlines_;  // with a deadline
  std::int64_t go_on_at_ = 0;  // the step to go on from after a missed round (catch_up()), 0: none
  // Tuned: the step the round started at, the codec's index in tune->codecs, the measures and
  // the picks.
  std::int64_t round_from_ = 0;
  std::size_t codec_at_ = own_codec;
  tuning_measure link_, basis_, recent_;  // the probe's, the last pick's, the rounds' since (smoothed)
  double small_s_ = 0;                    // the probe's small all-reduce
  bool tuned_state_ = false;              // the state loaded was a tuned policy's
  compress::layout layout_;               // the parameters' (the codecs picked work on them)
  static constexpr std::size_t own_codec = static_cast<std::size_t>(-1);  // codec_at_: the policy's own, none picked
  std::vector<tuning_choice> choices_;
  collective::aggregation_record aggregation_;
  moshpit_averager averager_;
  site_averaging<Codec> sites_;  // with a site
  ring_ordering ordering_;       // with ring
};

}  // namespace decentrain::comm
