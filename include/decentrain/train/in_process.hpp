// Runs one trainer per rank of an in-process network, each on its own thread with
// `threads_per_peer` OpenMP threads, and returns every peer's result (index = rank; joiners
// and peers started again by a deterministic run's churn schedule included: a rank's latest).
#pragma once

#include <functional>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "decentrain/data/dataset.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/train/metrics.hpp"
#include "decentrain/train/options.hpp"
#include "decentrain/transport/in_process.hpp"

namespace decentrain::train {

// `setup` runs on each trainer before fit (hooks, restore); it may be empty. The policies are
// copied to every peer.
template <class Trainer>
std::vector<fit_result> fit_in_process(const transport::in_process& network, const typename Trainer::model_config& config,
                                       trainer_options options, const data::token_dataset& dataset,
                                       typename Trainer::comm_policy comm = {},
                                       const std::function<void(Trainer&)>& setup = {}, int threads_per_peer = 1,
                                       typename Trainer::parallel_policy parallel = {},
                                       typename Trainer::fault_policy fault = {}) {
  decentrain::detail::check(threads_per_peer >= 1, "fit_in_process: threads_per_peer must be >= 1");
  options.compute_on_thread_clock = options.compute_on_thread_clock || threads_per_peer == 1;
  std::vector<fit_result> results(static_cast<std::size_t>(network.capacity()));  // a rank started again: its latest
  network.run([&](transport::in_process::endpoint& ep) {
#if defined(_OPENMP)
    omp_set_num_threads(threads_per_peer);
#endif
    const int r = ep.rank();
    Trainer t(config, options, ep, comm, parallel, fault);
    if (setup) setup(t);
    results[static_cast<std::size_t>(r)] = t.fit(dataset);
  });
  return results;
}

}  // namespace decentrain::train
