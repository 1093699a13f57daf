// Everything in compress: the codec concept, the codecs, the parser of codec specs, and their GPU
// kernels when nvcc compiles (the collective that carries a codec: collective/encoded_all_reduce.hpp).
#pragma once

#include "decentrain/compress/adaptive.hpp"
#include "decentrain/compress/blockwise.hpp"
#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/dct_top_k.hpp"
#include "decentrain/compress/error_feedback.hpp"
#include "decentrain/compress/fp4.hpp"
#include "decentrain/compress/half.hpp"
#include "decentrain/compress/identity.hpp"
#include "decentrain/compress/layout.hpp"
#include "decentrain/compress/parse_codec.hpp"
#include "decentrain/compress/powersgd.hpp"
#include "decentrain/compress/sign.hpp"
#include "decentrain/compress/significance.hpp"
#include "decentrain/compress/top_k.hpp"
#include "decentrain/kernels/quantize.hpp"
