// Everything in train: checkpointing a run and GPT-2 weight interchange (the trainer arrives
// with issue 4).
#pragma once

#include "decentrain/train/checkpoint.hpp"
#include "decentrain/train/gpt2_weights.hpp"
