// Pipeline schedules as data: the action lists, their check, their simulation and their
// execution on a peer, and the generators (GPipe, 1F1B, ZB-H1, ZB-V, interleaved 1F1B), found by
// name.
#pragma once

#include <string>
#include <string_view>

#include "decentrain/detail/error.hpp"
#include "decentrain/parallel/schedule/action.hpp"
#include "decentrain/parallel/schedule/check.hpp"
#include "decentrain/parallel/schedule/execute.hpp"
#include "decentrain/parallel/schedule/gpipe.hpp"
#include "decentrain/parallel/schedule/interleaved.hpp"
#include "decentrain/parallel/schedule/one_f_one_b.hpp"
#include "decentrain/parallel/schedule/simulate.hpp"
#include "decentrain/parallel/schedule/zb_h1.hpp"
#include "decentrain/parallel/schedule/zb_v.hpp"

namespace decentrain::parallel::schedule {

// The generators by name; a new schedule adds its line here. `chunks`: the model stages each
// peer holds (interleaved's v; ZB-V's two; the others hold one).
inline constexpr const char* names = "gpipe, 1f1b, zb-h1, zb-v, interleaved";

// The chunks a schedule runs per peer by default (interleaved takes any number, 2 unless set).
inline int default_chunks(std::string_view name) { return name == "zb-v" || name == "interleaved" ? 2 : 1; }

inline program by_name(std::string_view name, int peers, int micro_batches, int chunks = 1) {
  using decentrain::detail::check;
  if (name == "interleaved") return interleaved(peers, micro_batches, chunks);
  check(chunks == default_chunks(name), "pipeline: schedule ", std::string(name), " runs ", default_chunks(name),
        " chunk(s) per peer, not ", chunks, " (interleaved runs any number)");
  if (name == "gpipe") return gpipe(peers, micro_batches);
  if (name == "1f1b") return one_f_one_b(peers, micro_batches);
  if (name == "zb-h1") return zb_h1(peers, micro_batches);
  if (name == "zb-v") return zb_v(peers, micro_batches);
  decentrain::detail::fail("pipeline: unknown schedule '", std::string(name), "' (expected one of ", names, ")");
}

}  // namespace decentrain::parallel::schedule
