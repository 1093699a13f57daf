// Everything in data: tokenizers, llm.c token shards, datasets and the built-in corpus.
#pragma once

#include "decentrain/data/builtin_corpus.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/data/tokenizer.hpp"
