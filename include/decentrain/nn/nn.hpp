// Everything in nn: the GPT-2 configuration, presets, layers, model, its subspace and sampling.
#pragma once

#include "decentrain/nn/config.hpp"
#include "decentrain/nn/gpt.hpp"
#include "decentrain/nn/layers.hpp"
#include "decentrain/nn/sample.hpp"
#include "decentrain/nn/subspace.hpp"
