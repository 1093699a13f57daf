// The collectives: the communicator (all-reduce, partitioned all-reduce, broadcast, all-gather,
// all-to-all, groups, handles), shares balanced by bandwidth, the aggregators and the robust all-reduce that uses them, the encoded all-reduce
// that carries a codec, any_codec, and the two-level all-reduce over sites.
#pragma once

#include "decentrain/collective/aggregators.hpp"
#include "decentrain/collective/any_aggregator.hpp"
#include "decentrain/collective/any_codec.hpp"
#include "decentrain/collective/balanced_all_reduce.hpp"
#include "decentrain/collective/communicator.hpp"
#include "decentrain/collective/encoded_all_reduce.hpp"
#include "decentrain/collective/group.hpp"
#include "decentrain/collective/ring_order.hpp"
#include "decentrain/collective/robust_all_reduce.hpp"
#include "decentrain/collective/sites.hpp"
#include "decentrain/collective/two_level_all_reduce.hpp"
