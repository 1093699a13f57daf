// The whole library in one include. `single_include/decentrain/decentrain.hpp` is this file
// with every decentrain header inlined (scripts/amalgamate.py).
#pragma once

#include "decentrain/config.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/detail/meta.hpp"
#include "decentrain/core/core.hpp"
#include "decentrain/kernels/cpu/activation.hpp"
#include "decentrain/kernels/cpu/attention.hpp"
#include "decentrain/kernels/cpu/cross_entropy.hpp"
#include "decentrain/kernels/cpu/elementwise.hpp"
#include "decentrain/kernels/cpu/embedding.hpp"
#include "decentrain/kernels/cpu/gemm.hpp"
#include "decentrain/kernels/cpu/layer_norm.hpp"
#include "decentrain/kernels/cpu/optimizer.hpp"
#include "decentrain/kernels/cpu/reduce.hpp"
#include "decentrain/kernels/cpu/softmax.hpp"
#include "decentrain/autograd/autograd.hpp"
#include "decentrain/data/data.hpp"
#include "decentrain/nn/nn.hpp"
#include "decentrain/optim/optim.hpp"
#include "decentrain/io/io.hpp"
#include "decentrain/train/train.hpp"
