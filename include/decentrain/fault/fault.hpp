// Everything in fault: the policy concept, none and checkpoint_every.
#pragma once

#include "decentrain/fault/checkpoint_every.hpp"
#include "decentrain/fault/none.hpp"
#include "decentrain/fault/policy.hpp"
