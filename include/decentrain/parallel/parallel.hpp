// Everything in parallel: the policy concept, data parallelism, pipeline parallelism and its
// schedules as data.
#pragma once

#include "decentrain/parallel/data.hpp"
#include "decentrain/parallel/partition.hpp"
#include "decentrain/parallel/pipeline.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"
