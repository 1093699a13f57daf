// Pipeline schedules as data: the action lists, their check and their simulation, and the
// generators (GPipe, 1F1B, ZB-H1).
#pragma once

#include "decentrain/parallel/schedule/action.hpp"
#include "decentrain/parallel/schedule/check.hpp"
#include "decentrain/parallel/schedule/gpipe.hpp"
#include "decentrain/parallel/schedule/one_f_one_b.hpp"
#include "decentrain/parallel/schedule/simulate.hpp"
#include "decentrain/parallel/schedule/zb_h1.hpp"
