#!/usr/bin/env node
// The reference GPT-2 encoders timed on one text, for bench_tokenizer: gpt-3-encoder 1.1.4 (the
// JavaScript port of OpenAI's encoder.py) and, where installed, tiktoken (OpenAI's Rust encoder
// built to WebAssembly). Prints one JSON object per encoder: name, megabytes per second (median
// of `repeats` whole-text encodes after one warm-up), id count, FNV-1a of the ids.
// gpt-3-encoder is timed on one cold encode only: it appends each word's ids with
// Array.concat, quadratic in the text, so tinyshakespeare alone takes minutes.
//   npm install --prefix /tmp/gpt2ref gpt-3-encoder@1.1.4 tiktoken
//   NODE_PATH=/tmp/gpt2ref/node_modules node bench/tokenizer_reference.js TEXT [repeats]
const fs = require('fs');
const text = fs.readFileSync(process.argv[2], 'utf-8');
const bytes = Buffer.byteLength(text, 'utf-8');
const repeats = Number(process.argv[3] || 5);

function idsHash(ids) {
  let h = 0xcbf29ce484222325n;
  for (const id of ids) for (let k = 0; k < 4; ++k) h = BigInt.asUintN(64, (h ^ BigInt((id >>> (8 * k)) & 255)) * 0x100000001b3n);
  return h.toString(16).padStart(16, '0');
}
function time(name, encode, runs, warm) {
  let ids = warm ? encode(text) : null;
  const laps = [];
  for (let r = 0; r < runs; ++r) {
    const t0 = process.hrtime.bigint();
    ids = encode(text);
    laps.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  laps.sort((a, b) => a - b);
  console.log(JSON.stringify({ name, mb_per_s: bytes / 1e6 / laps[laps.length >> 1], count: ids.length, ids_fnv1a: idsHash(ids) }));
}

time('gpt-3-encoder 1.1.4 (node ' + process.version.slice(0, 3) + ')', require('gpt-3-encoder').encode, 1, false);
try {
  const enc = require('tiktoken').get_encoding('gpt2');
  const dir = require('path').dirname(require.resolve('tiktoken'));
  const version = JSON.parse(fs.readFileSync(require('path').join(dir, 'package.json'), 'utf-8')).version;
  time('tiktoken ' + version + ' (wasm)', t => Array.from(enc.encode_ordinary(t)), repeats, true);
} catch (e) {
  if (e.code !== 'MODULE_NOT_FOUND') throw e;
}
