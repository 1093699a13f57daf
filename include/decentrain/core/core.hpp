// Everything in core: dtypes, device tags, memory, shapes, rng, tensors and their creation.
#pragma once

#include "decentrain/core/compare.hpp"
#include "decentrain/core/device.hpp"
#include "decentrain/core/dtype.hpp"
#include "decentrain/core/factory.hpp"
#include "decentrain/core/memory.hpp"
#include "decentrain/core/rng.hpp"
#include "decentrain/core/shape.hpp"
#include "decentrain/core/tensor.hpp"
#include "decentrain/core/transfer.hpp"
