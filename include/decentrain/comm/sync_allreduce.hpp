// The data-parallel baseline (DDP): every step, gradients are averaged across the replicas with
// one all-reduce of the flattened gradient (through Codec, combined by Aggregator: the mean, or
// a robust aggregator against peers that send poison), so every replica applies the same update.
// With a target batch (hivemind's rule for peers of different speeds), each replica adds up as many
// micro-batches of its rows a step as its speed makes its share of the target, so the fast ones do
// not wait for the slow ones, and the replicas' gradients weigh by the rows each took. With a
// site, the gradients are averaged by the two-level all-reduce over the replicas' sites
// (comm/site_averaging.hpp): each byte crosses between the sites once per step of the collective
// across them, carried by every member of a site in equal parts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/ring_ordering.hpp"
#include "decentrain/comm/site_averaging.hpp"

namespace decentrain::comm {

template <class Codec = compress::identity, class Aggregator = collective::mean>
struct sync_allreduce {
  static_assert(compress::check_codec<Codec>());
  static_assert(collective::check_aggregator<Aggregator>());
  using policy_concept = policy_tag;
  static constexpr const char* name = "sync";
  // Every step ends with the replicas' parameters the same (the averaged gradient, the same
  // update): a stage's part may be taken from any of them (train/trainer.hpp's redeal).
  static constexpr bool replicas_equal_after_step = true;

  Codec codec{};
  Aggregator aggregator{};
  // Average the replicas' gradients by their step weights (ctx.step_weight: the rows each took,
  // say) instead of equally: the mean scales them (one all-reduce of a number more a step), a
  // robust aggregator weighs them (collective::encoded_all_reduce). Every replica the same.
  bool weighted = false;
  // Rows a step for the whole group (0: off, each replica takes batch_size rows a step). Each
  // replica takes micro-batches of batch_size rows, as many as its measured speed makes its share
  // (comm/policy.hpp's batch_sizing: re-measured every resize_every steps), adds their gradients
  // up (the trainer: accumulates()), and weighs by its rows (as `weighted`). Every replica the same.
  std::int64_t target_batch = 0;
  std::int64_t resize_every = 10;
  // This replica's site (1 to 63 bytes), or "auto" on every replica (the sites found from the
  // round trips the replicas measure): set, the gradients are averaged by the two-level
  // all-reduce over the sites (diloco::site says more). Every replica names a site or none does;
  // with the mean aggregator and a dense codec, not weighted nor with a target batch.
  std::string site{};
  // Set: the ring of the all-reduce follows the replicas' measured links (comm/ring_ordering.hpp),
  // measured before the first step's exchange and after each new view. Every replica the same;
  // not with `site` (its groups are no ring of every replica).
  std::optional<measured_ring> ring{};

  template <class Ctx>
  void start(Ctx& ctx) {
    decentrain::detail::check(target_batch >= 0, "sync_allreduce: target_batch must be >= 0 (0: off), got ", target_batch);
    decentrain::detail::check(resize_every >= 1, "sync_allreduce: resize_every must be >= 1, got ", resize_every);
    decentrain::detail::check(target_batch == 0 || target_batch >= ctx.batch_size, "sync_allreduce: target_batch (",
                              target_batch, " rows) is less than one micro-batch of batch_size (", ctx.batch_size, " rows)");
    decentrain::detail::check(target_batch <= (std::int64_t{1} << 40), "sync_allreduce: target_batch must be at most 2^40 ",
                              "rows, got ", target_batch);
    // The shares differ by design: a robust aggregator, which caps what a peer's weight may claim
    // (aggregation_record::weight_cap), would undo them.
    decentrain::detail::check(target_batch == 0 || collective::averages_in_flight(aggregator), "sync_allreduce: target_batch ",
                              "weighs each replica by the rows it was dealt, which aggregator '",
                              collective::describe_aggregator(aggregator), "' caps: use the mean");
    // Its micro-batches are dealt among replicas holding the whole model: one holding one stage of
    // several takes one step's rows with the other stages.
    decentrain::detail::check(target_batch == 0 || ctx.placement.stages == 1, "sync_allreduce: target_batch deals micro-batches ",
                              "to replicas holding the whole model, and this one holds one stage of ", ctx.placement.stages);
    if (ring) {
      ring->validate("sync_allreduce");
      decentrain::detail::check(site.empty(), "sync_allreduce: ring orders the all-reduce of every replica, and with a site ",
                                "there is none: set one of them");
    }
    if (!site.empty())
      site_averaging<Codec>::check(site, codec, aggregator, "sync_allreduce",
                                   target_batch > 0 ? "target_batch" : weighted ? "weighted" : "");
    sites_.forget();
    if (!site.empty()) sites_.keep_fresh(codec);  // (a resumed one: load() kept it)
    prepare_codec(codec, aggregator, ctx,
                  (target_batch > 0 ? decentrain::detail::concat(", a target batch of ", target_batch, " rows dealt every ",
                                                                 resize_every, " steps")
                                    : std::string()) +
                      (site.empty() ? std::string() : std::string(", averaged over sites")) +
                      (ring ? ", " + ring->describe() : std::string()));
    check_weighs(aggregator, weighs(), "sync_allreduce");
    micro_batches_ = target_batch > 0 ? (target_batch + ctx.batch_size - 1) / ctx.batch_size : 0;
    world_ = ctx.replicas.world();
    if (!ctx.resumed) {
      broadcast_parameters(ctx, buffer_);
      sizing_ = {};
    }
    sizing_.every = resize_every;
  }
  // With a target batch: a step's inner steps are micro-batches whose gradients add up (the trainer).
  bool accumulates() const { return target_batch > 0; }
  // Micro-batches this replica takes in `step` (its share of the target batch), else 1.
  std::int64_t local_steps(std::int64_t) const {
    return target_batch > 0 ? sizing_.share(micro_batches_, world_) : 1;
  }
  template <class Ctx>
  void after_backward(Ctx& ctx) {
    if (ctx.replicas.world() == 1) return;
    gather_grads(ctx.parameters, buffer_);
    if (!site.empty())
      sites_.average(ctx, site, codec, aggregator, aggregation_, std::span<float>(buffer_), false);
    else {
      if (ring) ordering_.order(ctx, *ring, codec, buffer_.size());
      collective::encoded_all_reduce(codec, ctx.replicas, std::span<float>(buffer_), true, aggregator, aggregation_,
                                     weight_if(weighs(), ctx.step_weight));
    }
    scatter_grads(ctx.parameters, buffer_);
  }
  // A re-formed view: the sites' groups are other peers.
  void drop_in_flight() { sites_.forget(); }
  // With a site: the sites of the last step; none before the first.
  std::optional<collective::site_map> sites() const { return sites_.sites(); }
  // With ring: the orders measured so far (ordering().last(): the last, and what it came from).
  const ring_ordering& ordering() const { return ordering_; }
  // What each replica's gradients looked like: dropped (non-finite, malformed) or far away.
  const collective::aggregation_record& aggregation() const { return aggregation_; }
  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (target_batch == 0) return;
    sizing_.add(ctx, micro_batches_);
    world_ = ctx.replicas.world();
  }
  void save(io::checkpoint& c) const {
    save_codec(codec, c, "comm.sync.codec.");
    sites_.save(c, "comm.sync.");
    if (target_batch > 0) sizing_.save(c, "comm.sync.");
  }
  void load(const io::checkpoint& c) {
    if (!site.empty()) sites_.keep_fresh(codec);  // (before its state is loaded)
    sites_.load(c, "comm.sync.");
    load_codec(codec, c, "comm.sync.codec.");
    sizing_.load(c, "comm.sync.");  // (its period: start() sets it)
  }

 private:
  bool weighs() const { return weighted || target_batch > 0; }

  std::vector<float> buffer_;
  batch_sizing sizing_;
  std::int64_t micro_batches_ = 0;  // of the whole group a step: target_batch in micro-batches
  int world_ = 1;
  collective::aggregation_record aggregation_;
  site_averaging<Codec> sites_;  // with a site
  ring_ordering ordering_;       // with ring
};

}  // namespace decentrain::comm
