// Everything in io: cereal glue, atomic files, checkpoints.
#pragma once

#include "decentrain/io/atomic_file.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/io/tensor_archive.hpp"
#include "decentrain/io/token_shard.hpp"
