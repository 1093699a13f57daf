// Everything in parallel: the policy concept, data parallelism, and pipeline schedules as data.
#pragma once

#include "decentrain/parallel/data.hpp"
#include "decentrain/parallel/policy.hpp"
#include "decentrain/parallel/schedule/schedule.hpp"
