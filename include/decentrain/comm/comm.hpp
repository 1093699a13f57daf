// Everything in comm: the policy concept and the communication policies.
#pragma once

#include "decentrain/comm/ad_psgd.hpp"
#include "decentrain/comm/auto_tuning.hpp"
#include "decentrain/comm/choco.hpp"
#include "decentrain/comm/diloco.hpp"
#include "decentrain/comm/gossip.hpp"
#include "decentrain/comm/push_sum.hpp"
#include "decentrain/comm/local_sgd.hpp"
#include "decentrain/comm/moshpit.hpp"
#include "decentrain/comm/streaming_diloco.hpp"
#include "decentrain/comm/policy.hpp"
#include "decentrain/comm/sync_allreduce.hpp"
