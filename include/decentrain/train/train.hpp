// Everything in train: the trainer, checkpointing a run, and GPT-2 weight interchange.
#pragma once

#include "decentrain/train/checkpoint.hpp"
#include "decentrain/train/gpt2_weights.hpp"
#include "decentrain/train/trainer.hpp"
