// Everything in io: cereal glue, atomic files, a background writer, checkpoints, safetensors, llm.c token shards.
#pragma once

#include "decentrain/io/atomic_file.hpp"
#include "decentrain/io/background_writer.hpp"
#include "decentrain/io/checkpoint.hpp"
#include "decentrain/io/json.hpp"
#include "decentrain/io/safetensors.hpp"
#include "decentrain/io/tensor_archive.hpp"
#include "decentrain/io/token_shard.hpp"
