// Everything autograd: the engine, the parameter registry and every differentiable op.
#pragma once

#include "decentrain/autograd/deferred.hpp"
#include "decentrain/autograd/grad_mode.hpp"
#include "decentrain/autograd/math.hpp"
#include "decentrain/autograd/ops/activation.hpp"
#include "decentrain/autograd/ops/attention.hpp"
#include "decentrain/autograd/ops/cast.hpp"
#include "decentrain/autograd/ops/dropout.hpp"
#include "decentrain/autograd/ops/elementwise.hpp"
#include "decentrain/autograd/ops/embedding.hpp"
#include "decentrain/autograd/ops/layer_norm.hpp"
#include "decentrain/autograd/ops/loss.hpp"
#include "decentrain/autograd/ops/matmul.hpp"
#include "decentrain/autograd/ops/reduce.hpp"
#include "decentrain/autograd/ops/shape.hpp"
#include "decentrain/autograd/parameters.hpp"
#include "decentrain/autograd/variable.hpp"
