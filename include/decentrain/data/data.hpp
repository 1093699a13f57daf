// Everything in data: tokenizers (bytes, characters, GPT-2's BPE), datasets and the built-in
// corpus.
#pragma once

#include "decentrain/data/builtin_corpus.hpp"
#include "decentrain/data/dataset.hpp"
#include "decentrain/data/gpt2_tokenizer.hpp"
#include "decentrain/data/tokenizer.hpp"
