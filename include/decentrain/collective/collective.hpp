// The collectives: the communicator (all-reduce, broadcast, all-gather, all-to-all, groups,
// handles), the aggregators and the robust all-reduce that uses them.
#pragma once

#include "decentrain/collective/aggregators.hpp"
#include "decentrain/collective/any_aggregator.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/group.hpp"
#include "decentrain/collective/robust_all_reduce.hpp"
