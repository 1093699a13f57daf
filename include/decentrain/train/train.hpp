// Everything in train: the slots' concepts, the trainer and its in-process runner, metrics and
// progress hooks, checkpointing a run, and GPT-2 weight interchange.
#pragma once

#include "decentrain/train/checkpoint.hpp"
#include "decentrain/train/concepts.hpp"
#include "decentrain/train/context.hpp"
#include "decentrain/train/gpt2_weights.hpp"
#include "decentrain/train/in_process.hpp"
#include "decentrain/train/metrics.hpp"
#include "decentrain/train/metrics_log.hpp"
#include "decentrain/train/options.hpp"
#include "decentrain/train/progress.hpp"
#include "decentrain/train/trainer.hpp"
