// Everything in nn: the GPT-2 configuration, presets, layers and model.
#pragma once

#include "decentrain/nn/config.hpp"
#include "decentrain/nn/gpt.hpp"
#include "decentrain/nn/layers.hpp"
