// Everything in parallel: the policy concept, data parallelism, pipeline parallelism, its
// schedules as data, and where to cut a model and place its stages.
#pragma once

#include "decentrain/parallel/data.hpp"
#include "decentrain/parallel/link_placement.hpp"
#include "decentrain/parallel/partition.hpp"
#include "decentrain/parallel/pipeline.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"
