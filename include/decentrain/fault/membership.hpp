// The membership protocol of an elastic group, one job per header under fault/membership/:
// view.hpp (views, positions, what an agreement decides), messages.hpp (the protocol's
// messages), agreement.hpp (the leader's and the followers' parts of an agreement, and
// installing a view), admission.hpp (joiners waiting to be admitted), state_transfer.hpp
// (members behind taking the state of those ahead).
#pragma once

#include "decentrain/fault/membership/admission.hpp"
#include "decentrain/fault/membership/agreement.hpp"
#include "decentrain/fault/membership/messages.hpp"
#include "decentrain/fault/membership/state_transfer.hpp"
#include "decentrain/fault/membership/view.hpp"
