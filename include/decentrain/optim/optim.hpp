// Everything in optim: AdamW, SGD (with Nesterov momentum), gradient clipping, schedules.
#pragma once

#include "decentrain/optim/adamw.hpp"
#include "decentrain/optim/clip.hpp"
#include "decentrain/optim/schedule.hpp"
#include "decentrain/optim/sgd.hpp"
