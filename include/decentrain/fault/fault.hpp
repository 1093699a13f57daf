// Everything in fault: the policy concept, none, checkpoint_every, and elastic groups (with a
// leaver's handoff).
#pragma once

#include "decentrain/fault/checkpoint_every.hpp"
#include "decentrain/fault/elastic.hpp"
#include "decentrain/fault/handoff.hpp"
#include "decentrain/fault/membership.hpp"
#include "decentrain/fault/none.hpp"
#include "decentrain/fault/policy.hpp"
