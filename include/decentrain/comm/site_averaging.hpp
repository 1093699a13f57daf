// Averaging over sites for a communication policy (diloco's and sync_allreduce's `site`): the
// two-level all-reduce (collective/two_level_all_reduce.hpp) of what the policy averages, with
// what a policy needs around it:
//   - the groups made where there are none for the replicas' communicator (the first exchange, a
//     new view), from the sites the replicas name or, for "auto", find by their round trips;
//   - a codec's state (error feedback's residual) kept for the segment this replica reduces
//     across, and started afresh where that segment moved (a new view, another layout resumed, a
//     state taken from another member): the segment is in the checkpoint;
//   - a result that is not finite redone flat, in f32, through the policy's aggregator, which
//     drops and names the replica that sent it (every replica sees the same result, so all redo
//     it), as the flat policies' mean does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "decentrain/collective/two_level_all_reduce.hpp"
#include "decentrain/comm/policy.hpp"

namespace decentrain::comm {

template <class Codec>
class site_averaging {
 public:
  // Fails naming the setting when `site` cannot be averaged over as `who` is set: a name of
  // 1 to 63 bytes, the mean aggregator (it sums on the way), a dense codec (its payloads are
  // added on the way), and no `conflict` (the policy's other setting that weighs, non-empty).
  template <class Aggregator>
  static void check(const std::string& site, const Codec& codec, const Aggregator& aggregator, const char* who,
                    const std::string& conflict) {
    decentrain::detail::check(site.size() <= collective::site_map::max_name_bytes, who, ": site names are at most ",
                              collective::site_map::max_name_bytes, " bytes, got ", site.size());
    decentrain::detail::check(conflict.empty(), who, ": averaging over sites (site '", site, "') is one plain mean; set it without ",
                              conflict);
    decentrain::detail::check(collective::averages_in_flight(aggregator), who, ": averaging over sites sums on the way, so it ",
                              "takes the mean aggregator, not ", collective::describe_aggregator(aggregator));
    decentrain::detail::check(compress::is_dense(codec), who, ": averaging over sites adds the codec's payloads on the way, ",
                              "which a sparse codec's cannot be (", compress::describe(codec), "): use a dense one (identity, ",
                              "fp16, bf16, int8, int4, fp4)");
  }

  // The codec as configured, before any state: at the start, and before a state is loaded
  // (the first of the two keeps it).
  void keep_fresh(const Codec& codec) {
    if (!fresh_) fresh_ = codec;
  }
  // A new view: its groups are other peers.
  void forget() { levels_.reset(); }

  // The groups for ctx.replicas, made where there are none; `values` is the length averaged.
  template <class Ctx>
  collective::two_level<transport::any_endpoint>& levels(Ctx& ctx, const std::string& site, Codec& codec, std::size_t values) {
    if (levels_ && levels_of_ == &ctx.replicas) return *levels_;
    levels_ = std::make_shared<collective::two_level<transport::any_endpoint>>(
        ctx.replicas, site == "auto" ? collective::sites_by_latency(ctx.replicas, 4.0, probes_++)
                                     : collective::agree_on_sites(ctx.replicas, site));
    levels_of_ = &ctx.replicas;
    const auto [first, last] = levels_->across() ? levels_->segment(values, levels_->sites().position(ctx.replicas.rank()),
                                                                    collective::codec_block(codec))
                                                 : std::pair<std::size_t, std::size_t>{0, 0};
    const auto key = levels_->sites().describe() + " | values " + std::to_string(first) + " to " + std::to_string(last);
    if (!across_key_.empty() && key != across_key_ && fresh_) {
      codec = *fresh_;
      compress::set_layout(codec, layout_of(ctx.parameters));
    }
    across_key_ = key;
    return *levels_;
  }

  // `values` averaged over the replicas by sites. `same_in_site`: the members of a site may hold
  // the same values (a site synchronous inside); they check it (8 bytes), and where they do,
  // step 1 sends nothing.
  template <class Ctx, class Aggregator>
  void average(Ctx& ctx, const std::string& site, Codec& codec, Aggregator& aggregator, collective::aggregation_record& record,
               std::span<float> values, bool same_in_site) {
    auto& two = levels(ctx, site, codec, values.size());
    bool same = false;
    if (same_in_site && two.site().world() > 1)
      same = two.site().all_same(decentrain::detail::fnv1a(
          std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float))));
    sent_.assign(values.begin(), values.end());
    two.reduce(
        values, collective::reduce_op::average, collective::codec_block(codec),
        [&codec](auto& across, std::span<float> segment) { collective::encoded_all_reduce(codec, across, segment, false); }, same);
    if (std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); })) return;
    std::copy(sent_.begin(), sent_.end(), values.begin());
    compress::identity f32;
    collective::encoded_all_reduce(f32, ctx.replicas, values, true, aggregator, record, std::nullopt);
  }

  // The sites of the last exchange; none before the first.
  std::optional<collective::site_map> sites() const {
    if (!levels_) return std::nullopt;
    return levels_->sites();
  }

  void save(io::checkpoint& c, const std::string& prefix) const {
    if (!across_key_.empty()) c.text[prefix + "site.across"] = across_key_;
  }
  void load(const io::checkpoint& c, const std::string& prefix) {
    const auto it = c.text.find(prefix + "site.across");
    across_key_ = it == c.text.end() ? std::string() : it->second;
  }

 private:
  // Shared so that the policy stays copyable; one trainer uses it.
  std::shared_ptr<collective::two_level<transport::any_endpoint>> levels_;
  const void* levels_of_ = nullptr;  // the communicator the groups were made over
  std::vector<float> sent_;          // the values as sent (a result not finite is redone)
  std::string across_key_;           // the sites and the segment this replica reduced across
  std::uint32_t probes_ = 0;         // "auto": the round trips measured so far (each a tag)
  std::optional<Codec> fresh_;       // the codec before any state
};

}  // namespace decentrain::comm
