// A two-level all-reduce over peers at sites (collective/sites.hpp; the shape of NCCL's and
// Horovod's hierarchical all-reduce, and of INTELLECT-1's outer averaging between clusters).
// The buffer is cut into k segments, k the members of the smallest site:
//   1. inside each site, every member sends segment j to the site's member j, which adds them up
//      (its own values first, then the others' in site order);
//   2. member j of each site reduces segment j with member j of every other site (a collective
//      of its own: the communicator's all-reduce, or a codec's): each member carries 1/k of the
//      traffic between sites, and each byte leaves a site once per step of that collective,
//      where a flat ring sends the whole buffer over every hop that leaves a site;
//   3. member j sends the result to the others of its site.
// Members beyond the k-th of a larger site reduce nothing: they send their values and receive
// the result. Every peer ends with the same bits: a segment is reduced on one member per site in
// a fixed order, then by one collective. The sums are taken in another order than a flat
// all-reduce's, so the two agree bit for bit where the values add exactly (integers) and within
// rounding otherwise.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/sites.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/transport/any_endpoint.hpp"

namespace decentrain::collective {

// The groups a peer takes part in: its site's members, and the members at its place in every
// site (those of place k and beyond take part in none across). Every peer of `world` makes one
// with the same map at the same point of its run (each makes its groups: communicator::group).
// `world` must outlive it and stay where it is.
template <transport::endpoint Endpoint>
class two_level {
 public:
  two_level(communicator<Endpoint>& world, site_map sites) : map_(std::move(sites)) {
    decentrain::detail::check(map_.world() == world.world(), "two_level: the site map names ", map_.world(), " peers, the group has ",
                              world.world());
    const int me = world.rank();
    segments_ = map_.smallest();
    place_ = map_.position(me);
    site_.emplace(world.group(map_.members(map_.site_of(me))));
    if (place_ < segments_) {
      std::vector<int> across;
      for (int s = 0; s < map_.sites(); ++s) across.push_back(map_.members(s)[static_cast<std::size_t>(place_)]);
      across_.emplace(world.group(std::move(across)));
    }
  }

  const site_map& sites() const { return map_; }
  // The members at this peer's place in every site (none beyond the smallest site's size).
  communicator<transport::any_endpoint>* across() { return across_ ? &*across_ : nullptr; }
  communicator<transport::any_endpoint>& site() { return *site_; }
  // The segment of `size` values that the members at place `j` reduce, cut at multiples of
  // `align` values (a codec's block).
  std::pair<std::size_t, std::size_t> segment(std::size_t size, int j, std::size_t align = 1) const {
    const std::size_t blocks = (size + align - 1) / align, k = static_cast<std::size_t>(segments_), at = static_cast<std::size_t>(j);
    const std::size_t base = blocks / k, extra = blocks % k;
    const std::size_t first = (at * base + std::min(at, extra)) * align;
    const std::size_t last = ((at + 1) * base + std::min(at + 1, extra)) * align;
    return {std::min(first, size), std::min(last, size)};
  }

  // Sum (or min, max, average) of every peer's `data`, into `data` on every peer.
  template <class T>
  void all_reduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    static_assert(std::is_arithmetic_v<T>, "two_level::all_reduce: elements must be arithmetic");
    const reduce_op across_op = op == reduce_op::average ? reduce_op::sum : op;
    reduce(data, op, 1, [across_op](communicator<transport::any_endpoint>& across, std::span<T> segment) {
      across.all_reduce(segment, across_op);
    });
  }

  // The same with step 2 given: across(communicator, segment) must leave in `segment` the sum
  // (for sum and average; min, max: that) of the segment over the communicator's members, the
  // same bits on each (a codec's encoded all-reduce). Segments are cut at multiples of `align`.
  // `same_in_site`: every member of a site holds the same values (a site that trains as one
  // replica), so step 1 sends nothing: a sum counts the site's values once per member (its
  // segment scaled by the site's size), and min and max once.
  template <class T, class Across>
  void reduce(std::span<T> data, reduce_op op, std::size_t align, Across&& across, bool same_in_site = false) {
    decentrain::detail::check(align >= 1, "two_level: align must be >= 1");
    auto& site = *site_;
    const int m = site.world(), p = place_;
    const std::size_t chunk = std::max<std::size_t>(1, site.settings().chunk_bytes / sizeof(T));
    // Steps 1 and 3 go a window of chunks at a time, each said (expect_from) before its
    // messages are sent: what a transport with bounded queues holds for this collective stays
    // within a window from each member, however large the buffer.
    const std::size_t window = std::max<std::size_t>(1, site.settings().window_bytes / (chunk * sizeof(T)));
    auto part = [&](int j) {
      const auto [first, last] = segment(data.size(), j, align);
      return data.subspan(first, last - first);
    };
    // Chunks [from, to) of segment j (fewer where it ends sooner).
    auto chunks = [&](int j, std::size_t from, std::size_t to) {
      const auto s = part(j);
      std::vector<std::span<T>> out;
      for (std::size_t c = from; c < to && c * chunk < s.size(); ++c)
        out.push_back(s.subspan(c * chunk, std::min(chunk, s.size() - c * chunk)));
      return out;
    };
    auto expect = [&](int q, int j, std::size_t from, std::size_t to) {
      std::vector<std::size_t> sizes;
      for (const auto& c : chunks(j, from, to)) sizes.push_back(c.size_bytes());
      if (!sizes.empty()) site.expect_from(q, std::span<const std::size_t>(sizes));
    };
    std::size_t most = 0;
    for (int j = 0; j < segments_; ++j) most = std::max(most, (part(j).size() + chunk - 1) / chunk);
    const bool owns = p < segments_;
    if (m > 1 && same_in_site) {
      if (owns && (op == reduce_op::sum || op == reduce_op::average))
        for (auto& x : part(p)) x = static_cast<T>(x * static_cast<T>(m));
    } else if (m > 1) {
      std::vector<T> in(chunk);
      for (std::size_t from = 0; from < most; from += window) {
        const std::size_t to = std::min(most, from + window);
        if (owns)
          for (int q = 0; q < m; ++q)
            if (q != p) expect(q, p, from, to);
        for (int j = 0; j < segments_; ++j)
          if (j != p)
            for (const auto& c : chunks(j, from, to)) site.send_to(j, std::span<const T>(c));
        if (owns)
          for (int q = 0; q < m; ++q) {
            if (q == p) continue;
            for (const auto& c : chunks(p, from, to)) {
              const auto got = std::span<T>(in).first(c.size());
              site.recv_from(q, got);
              combine(c, std::span<const T>(got), op);
            }
          }
      }
    }
    if (owns) {
      const auto mine = part(p);
      if (across_ && across_->world() > 1) across(*across_, mine);
      if (op == reduce_op::average)
        for (auto& x : mine) x = static_cast<T>(x / static_cast<T>(map_.world()));
    }
    if (m > 1)
      for (std::size_t from = 0; from < most; from += window) {
        const std::size_t to = std::min(most, from + window);
        for (int j = 0; j < segments_; ++j)
          if (j != p) expect(j, j, from, to);
        if (owns)
          for (int q = 0; q < m; ++q)
            if (q != p)
              for (const auto& c : chunks(p, from, to)) site.send_to(q, std::span<const T>(c));
        for (int j = 0; j < segments_; ++j)
          if (j != p)
            for (const auto& c : chunks(j, from, to)) site.recv_from(j, c);
      }
  }

 private:
  template <class T>
  static void combine(std::span<T> into, std::span<const T> from, reduce_op op) {
    for (std::size_t i = 0; i < into.size(); ++i) {
      if (op == reduce_op::max) into[i] = std::max(into[i], from[i]);
      else if (op == reduce_op::min) into[i] = std::min(into[i], from[i]);
      else into[i] = static_cast<T>(into[i] + from[i]);
    }
  }

  site_map map_;
  int segments_ = 1, place_ = 0;
  std::optional<communicator<transport::any_endpoint>> site_, across_;
};

}  // namespace decentrain::collective
