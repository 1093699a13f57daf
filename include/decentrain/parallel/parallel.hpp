// Everything in parallel: the policy concept and data parallelism.
#pragma once

#include "decentrain/parallel/data.hpp"
#include "decentrain/parallel/policy.hpp"
