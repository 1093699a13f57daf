// Everything in train: checkpointing of a training run (the trainer arrives with issue 4).
#pragma once

#include "decentrain/train/checkpoint.hpp"
