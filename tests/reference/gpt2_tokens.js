#!/usr/bin/env node
// Reference ids for the GPT-2 tokenizer test, from the npm package gpt-3-encoder 1.1.4 (OpenAI's
// encoder.py ported to JavaScript, with GPT-2's published vocabulary):
//   npm install --prefix /tmp/gpt2ref gpt-3-encoder@1.1.4
//   NODE_PATH=/tmp/gpt2ref/node_modules node tests/reference/gpt2_tokens.js ../shared/data/tinyshakespeare.txt
// writes tests/reference/fixtures/gpt2_tokens.json: tricky strings and seeded random strings
// with their ids, and for tinyshakespeare (too large to commit) the text's and the ids' FNV-1a
// hashes, per-chunk hashes to say where a difference starts, and the first ids.
const fs = require('fs');
const path = require('path');
const { encode } = require('gpt-3-encoder');

const tricky = [
  '', 'Hello world', 'Hello, World! How are you?', '  leading spaces', 'trailing spaces   ',
  'multiple   spaces   between', '\n\n\nnewlines\n', 'tabs\t\tand\r\nCRLF\r\n', '   \n   \n', ' ', '\n',
  "I'm you're we've they'll he'd it's can't DON'T 'tis o'clock rock'n'roll ''s ''' 'S 'LL",
  "she's'd'll", "x'sy 're've", 'Ünïcödé façade naïve café', '日本語のテキスト、です。', '中文字符和English混合',
  '한국어 텍스트', 'العربية ١٢٣٤ والأرقام', 'हिन्दी में पाठ', 'Ελληνικά γράμματα', 'Русский текст', 'e\u0301te\u0301',
  'emoji 😀👍🏽 👨‍👩‍👧‍👦 🇺🇸!', '1234567890 3.14159 1,000,000 ½ ² Ⅻ ٣ 𝟘𝟙', '2024-05-20T12:00:00Z',
  'a\u00a0b\u3000c\u2028d\u0085e\u000bf\u000cg\u200bh\u200di\ufeffj', '\u0000\u0001\u001f\u007f',
  '<|endoftext|>', 'one<|endoftext|>two', '!!!???...,,,;;;', ',,,,,,,,,,,,,,,,', 'a,b,,c,,,d',
  'int main() { return 0; }\n    if (x) {\n\t\ty = x**2;\n    }\n',
  'https://example.com/path?q=1&r=2#frag', "The year 1999's best-selling album cost $12.99 (USD).",
  'Ａｂｃ１２３　全角', ' '.repeat(300), 'a'.repeat(500), 'ab'.repeat(300), '\n'.repeat(50) + 'x',
  ' \u00a0 x', '\t x', 'x \t', '  !', ' 1', '  1', ' 😀', '  😀', '$$$ €€€ £', '----====____', '\u2028\u2029',
];

// mulberry32: seeded, so the committed strings can be made again.
function rng(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pool = [...'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789', ...' .,;:!?-_()[]{}"/\\$%&*+=<>@#^|~`',
  ' ', ' ', ' ', '\n', '\t', '\r', "'", "'s", "'ll", "'re", 'é', 'ß', 'ø', 'Ω', 'ж', 'ת', 'ب', '中', '語', 'の', '가',
  '😀', '🏽', '\u200d', '\u00a0', '\u3000', '\u0301', '٣', '½', '²', 'Ⅻ', '\u2028', '\u0085', '\u000b', '€', '…'];
const next = rng(20240520);
const random = [];
for (let i = 0; i < 300; ++i) {
  const n = 1 + Math.floor(next() * 40);
  let s = '';
  for (let j = 0; j < n; ++j) s += pool[Math.floor(next() * pool.length)];
  random.push(s);
}

function fnv1a(bytes) {
  let h = 0xcbf29ce484222325n;
  for (const b of bytes) h = BigInt.asUintN(64, (h ^ BigInt(b)) * 0x100000001b3n);
  return h.toString(16).padStart(16, '0');
}
function idsHash(ids) {  // FNV-1a over the ids as little-endian uint32
  const buf = Buffer.alloc(ids.length * 4);
  ids.forEach((id, i) => buf.writeUInt32LE(id, i * 4));
  return fnv1a(buf);
}

const out = { reference: 'gpt-3-encoder@1.1.4 under Node.js ' + process.version + ' (Unicode ' + process.versions.unicode + ')',
              cases: [...tricky, ...random].map(text => ({ text, ids: encode(text) })) };
const shakespeare = process.argv[2];
if (shakespeare) {
  const bytes = fs.readFileSync(shakespeare);
  const ids = encode(bytes.toString('utf-8'));
  const chunk = 16384;
  const chunks = [];
  for (let i = 0; i < ids.length; i += chunk) chunks.push(idsHash(ids.slice(i, i + chunk)));
  out.tinyshakespeare = { text_bytes: bytes.length, text_fnv1a: fnv1a(bytes), count: ids.length,
                          ids_fnv1a: idsHash(ids), chunk, chunk_fnv1a: chunks, head: ids.slice(0, 256) };
}
const file = path.join(__dirname, 'fixtures', 'gpt2_tokens.json');
fs.writeFileSync(file, JSON.stringify(out, null, 0).replace(/\{"text"/g, '\n{"text"') + '\n');
console.log('wrote ' + file + ' (' + out.cases.length + ' strings' + (shakespeare ? ', tinyshakespeare' : '') + ')');
