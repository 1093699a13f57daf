// Parallelism policies decide what each peer computes. `data` (the only one so far): every peer
// holds the whole model and trains on its own rows of the global batch. Pipeline and SWARM
// policies slot in here with the same concept.
#pragma once

#include <concepts>
#include <cstdint>
#include <utility>

#include "decentrain/data/dataset.hpp"
#include "decentrain/detail/meta.hpp"

namespace decentrain::parallel {

struct policy_tag {};

template <class P>
concept declares_parallel_policy = decentrain::detail::opts_into<P, policy_tag>;

template <class P>
concept parallel_policy = declares_parallel_policy<P> &&
                          requires(const P& p, const data::token_dataset& ds, std::int64_t i, std::uint64_t seed, int r) {
                            { p.batch(ds, i, i, i, seed, r, r) } -> std::same_as<std::pair<tensor<cpu>, tensor<cpu>>>;
                          };

struct data {
  using policy_concept = policy_tag;
  static constexpr const char* name = "data";

  // Rows rank*B .. rank*B+B-1 of the global batch of step `step`.
  std::pair<tensor<cpu>, tensor<cpu>> batch(const decentrain::data::token_dataset& ds, std::int64_t step,
                                            std::int64_t batch_size, std::int64_t block, std::uint64_t seed, int rank,
                                            int world) const {
    return ds.batch<cpu>(decentrain::data::split::train, step, batch_size, block, seed, rank, world);
  }
};

}  // namespace decentrain::parallel
