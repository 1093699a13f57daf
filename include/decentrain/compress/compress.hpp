// Everything in compress: the codec concept, all-reduce through a codec, the codecs, and their
// GPU kernels when nvcc compiles.
#pragma once

#include "decentrain/compress/adaptive.hpp"
#include "decentrain/compress/all_reduce.hpp"
#include "decentrain/compress/any_codec.hpp"
#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/dct_top_k.hpp"
#include "decentrain/compress/error_feedback.hpp"
#include "decentrain/compress/fp4.hpp"
#include "decentrain/compress/half.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/compress/powersgd.hpp"
#include "decentrain/compress/sign.hpp"
#include "decentrain/compress/top_k.hpp"
#include "decentrain/kernels/quantize.hpp"
