// Everything in compress: the codec concept, the codec-aware all-reduce and the codecs.
#pragma once

#include "decentrain/compress/codec.hpp"
#include "decentrain/compress/identity.hpp"
