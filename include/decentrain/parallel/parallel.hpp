// Everything in parallel: the policy concept, data parallelism, pipeline parallelism, its
// schedules as data, where to cut a model and place its stages, and SWARM's parts.
#pragma once

#include "decentrain/parallel/data.hpp"
#include "decentrain/parallel/link_placement.hpp"
#include "decentrain/parallel/partition.hpp"
#include "decentrain/parallel/pipeline.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"
#include "decentrain/parallel/stage_model.hpp"
#include "decentrain/parallel/swarm.hpp"
#include "decentrain/parallel/swarm/rebalance.hpp"
#include "decentrain/parallel/swarm/router.hpp"
