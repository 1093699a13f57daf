// decentrain-gpt: train (on one machine or as decentralized peers), evaluate and sample GPT-2 models.
//
//   decentrain-gpt train  [--preset NAME | --n-layer L --n-head H --n-embd C --block-size T]
//                         [--data PATH] [--steps N] [--batch-size B] [--lr LR] [--seed S]
//                         [--checkpoint-dir DIR] [--resume] [--threads N] [--metrics FILE]
//                         [--peers N | --listen HOST:PORT ... | --mpi] [--comm NAME] ...
//   decentrain-gpt eval   --weights W.safetensors --tokens SHARD [--n-head H]
//                         [--batch-size B] [--block-size T] [--dump-grads G.safetensors]
//   decentrain-gpt prepare --input TEXT --out DIR [--tokenizer gpt2|byte]
//   decentrain-gpt sample (--checkpoint FILE|DIR | --weights W.safetensors [--n-head H])
//                         [--prompt TEXT | --prompt-ids 1,2,3] [--tokens N] [--temperature X]
//                         [--top-k K] [--seed S]
//   decentrain-gpt --version
//
// Every mode of `train` is the library's trainer: one process is a world of one peer.
// `decentrain-gpt help` lists every option with its default.
#include <decentrain/decentrain.hpp>

#include <glob.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dt = decentrain;
namespace fs = std::filesystem;

namespace {

// Set by SIGINT; every trainer asks it between steps (trainer::stop_when), and the fault policy
// saves each peer's state before fit returns.
std::atomic<bool> interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT handler sets it");
extern "C" void on_interrupt(int) { interrupted = true; }

// ---- help ----------------------------------------------------------------------------------

// {name} marks a default that comes from the library's structs (filled in by usage()), so the
// help cannot drift from what the trainer does.
const char* usage_template = R"(decentrain-gpt: train, evaluate and sample GPT-2 models, on one machine or as decentralized peers.

decentrain-gpt train [options]
  --preset NAME          tiny | shakespeare-char | gpt2-124m   (default tiny)
  --n-layer/--n-head/--n-embd/--block-size N   override the preset
  --dropout P            (default: the preset's)
  --no-bias              no biases in linears and layer norms (nanoGPT's bias=False)
  --data PATH            text (a file or a glob of files), llm.c token shards (a file, a glob
                         such as 'dir/train_*.bin', or a folder made by `prepare`, whose
                         val_*.bin is then the validation split); default: the built-in corpus
  --tokenizer NAME       for text: char (its distinct bytes; default) | byte | gpt2
  --vocab DIR            GPT-2's encoder.json + vocab.bpe (default: the installed copy)
  --vocab-size N         vocabulary for token shards (default: prepare.json's, else 50257 with
                         --tokenizer gpt2, else the preset's)
  --val-data PATH        token shards for validation (a file or a glob)
  --val-fraction F       held-out fraction of the data when there is no --val-data (default 0.1)
  --steps N              optimizer steps in all (default {steps})
  --batch-size B         sequences per step, per peer (default {batch_size})
  --lr LR                peak learning rate of the cosine schedule (default {lr})
  --min-lr LR            cosine floor (default {min_lr})
  --warmup N             warmup steps (default {warmup})
  --beta1 B              AdamW beta1 (default {beta1})
  --beta2 B              AdamW beta2 (default {beta2})
  --weight-decay W       AdamW weight decay on matrices (default {weight_decay})
  --grad-clip X          global-norm clip, 0 to disable (default {grad_clip})
  --allow-non-finite     train on when the loss becomes NaN or infinite (by default the run
                         stops with an error before that step is saved)
  --compute-dtype T      f32 (default) or bf16: mixed precision, bf16 activations and products
                         with f32 weights, optimizer state and gradients
  --eval-every N         steps between evaluations, 0 for only at the end (default 250)
  --eval-batches N       batches per evaluation (default 20)
  --seed S               seed of every random stream (default {seed})
  --threads N            CPU threads per peer (default: OMP_NUM_THREADS or all cores for one
                         process alone, 1 in the decentralized modes)
  --metrics FILE         JSON lines: a "config" line, then a line per step and per evaluation,
                         each naming its peer ("rank") (default metrics.jsonl; '' to disable).
                         One file for every peer of a process; over TCP or MPI each process
                         writes its own: "{rank}" in FILE becomes the rank, else FILE gets
                         .rank-R before its extension (metrics.rank-1.jsonl)

  Checkpoints (every mode; one process alone is peer 0 of 1):
  --checkpoint-dir DIR   each peer saves DIR/peer-R-of-W/step-N.ckpt (default: none; then only
                         Ctrl-C saves, to ./checkpoints)
  --save-every N         steps between checkpoints, and one after the last step (default {save_every};
                         0: only on Ctrl-C)
  --keep-checkpoints N   newest checkpoints kept per peer (default {keep_checkpoints})
  --resume               continue from the newest step in DIR that every peer has (--elastic:
                         each peer from its own newest)
  Ctrl-C stops every peer at the same step (peers agree every {stop_check_every} steps), saves each
  peer's checkpoint and exits with status 130.

  Decentralized training (one of three modes; --batch-size is then per peer):
  --peers N              N peers as threads of this process, over simulated links
  --link NAME            ideal | lan | wan | heterogeneous (default lan)
  --listen HOST:PORT     this process is one TCP peer, listening here...
  --join HOST:PORT,...   ...joining through these peers (not for the first)
  --advertise HOST       the host others reach this peer at (needed with --listen 0.0.0.0:PORT)
  --rank R --world W     ...as peer R of W
  --key-file PATH        over TCP: the run's secret key (16 to 4096 bytes, readable only by you;
                         make one with: head -c 32 /dev/urandom > run.key). Only peers holding
                         the same key can join, and every frame is authenticated. Also read from
                         the file that DECENTRAIN_KEY_FILE names. Without one, anyone who can
                         reach the port can join the group
  --handshake-timeout-ms MS
                         over TCP: a connection must say (and prove) who it is within this
                         (default {handshake_ms})
  --mpi                  every rank of mpirun is a peer (when built with MPI)
  --elastic              with --peers or --listen: peers that die, freeze or are cut off are left
                         out and the others train on (fault::elastic); the summary lists the
                         changes; under MPI a dead rank ends the job. Ctrl-C on a TCP peer
                         saves it and leaves the group (the others go on); with --resume a
                         restarted group starts from each peer's newest checkpoint, and those
                         behind take the state of the furthest.
                         Over TCP, a peer started later with --join and a rank of its own
                         (--rank R --world W, R at or above W, or a rank the group left out)
                         enters the running group and takes its state from the members
  --max-world N          --elastic over TCP: the ranks the group may ever hold, joiners included
                         (default {max_world})
  --peer-timeout-ms MS   over TCP: how long to wait for a live peer's message (one still computing)
                         before failing (default {recv_timeout_ms})
  --heartbeat-ms MS      over TCP: every connection carries a heartbeat this often; 0 turns them
                         off, and a frozen peer is then found only by --peer-timeout-ms
                         (default {heartbeat_ms})
  --silence-ms MS        over TCP: a peer heard from nothing for longer than its deadline (from
                         its measured heartbeats, never under this) is taken for frozen or cut
                         off (default {silence_ms})
  --agreement-timeout-ms MS
                         --elastic: how long a live peer may take to join an agreement on the
                         group; over TCP more than --silence-ms, since a peer may first wait
                         that long on a frozen one (default {agreement_timeout_ms})
  --kill R@S,...         with --peers and --elastic: kill peer R once it has done S steps (a demo
                         and a test of the elastic group)
  --link-in-flight MB    over TCP or MPI: the slowest link's bandwidth x latency in MB (100 Mbit/s
                         x 100 ms = 1.25), so all-reduces move enough per step to hide latency;
                         the same on every peer (simulated links size this on their own)
  --comm NAME            sync | local-sgd | diloco | streaming-diloco (default diloco; sync for
                         one process alone)
  --inner-steps H        steps between averages for local-sgd and diloco, between two exchanges
                         of the same fragment for streaming-diloco (default 50)
  --fragments P          streaming-diloco: the model's layers dealt into P fragments (strided),
                         each exchanged every H steps, H/P steps after the previous (default 4)
  --overlap TAU          streaming-diloco and diloco: an exchange runs beside the next TAU inner
                         steps before it is merged (default 1 for streaming-diloco, 0 for diloco)
  --mix ALPHA            with --overlap: at a merge a peer keeps ALPHA of its own parameters and
                         takes 1 - ALPHA of the new global ones (default 0.5)
  --eager                streaming-diloco and diloco: eager updates, an exchange overlaps a whole
                         round and the peer steps at once with its own pseudo-gradient standing in
                         for its share of the average (instead of --overlap and --mix)
  --codec SPEC           how payloads go on the wire (default identity): fp16 | bf16 |
                         int8[:block=N,stochastic,seed=S] | int4[:...] | fp4[:block=N] |
                         sign[:block=N] | topk:FRACTION | topk:count=K (values f32, or ",int4"
                         or ",int2"), each with ",ef" for error feedback and ",adaptive" to
                         send f32 where that measures faster; dct:FRACTION with
                         chunk=N and top-k's settings (DeMo's DCT top-k); powersgd:rank=R
                         with noef, seed=S, factors=int8|int4|bf16|fp16|fp4 (for example
                         --codec int4:block=64, --codec topk:0.02,int2,ef, --codec
                         int8:adaptive, --codec powersgd:rank=4,factors=int8)
  --aggregator SPEC      how the peers' contributions combine (default mean): mean | median |
                         trimmed-mean[:trim=F] | centered-clip[:iterations=N,radius=R], each
                         with ",bucket=S" (average random groups of S first) and
                         ",partitioned" (each peer aggregates a slice: a ring's traffic, not
                         N times it); against peers that send poison, for example --aggregator
                         centered-clip or --aggregator trimmed-mean:trim=0.25,partitioned.
                         Contributions holding NaN or infinities are always left out, and the
                         summary names the peers whose contributions were left out or far off
  --outer-lr X           DiLoCo's outer Nesterov learning rate (default 0.7)
  --outer-momentum X     DiLoCo's outer momentum (default 0.9)

decentrain-gpt prepare --input TEXT --out DIR [options]   text to llm.c token shards
  --input PATH           a text file or a glob of them, each one document (led by <|endoftext|>)
  --tokenizer NAME       gpt2 (default) | byte           --vocab DIR   as for train
  --val-fraction F       the last F of the tokens go to DIR/val_000000.bin (default 0.1)
  --shard-tokens N       tokens per DIR/train_NNNNNN.bin (default 100000000)
  Writes DIR/prepare.json too, so `train --data DIR` knows the tokenizer.

decentrain-gpt version   prints the version (also --version)

decentrain-gpt eval --weights W.safetensors --tokens SHARD [--n-head H] [options]
  --n-head H             the weights' heads; read from config.json beside them when it is there
  --batch-size B         rows (default 4)     --block-size T   tokens per row (default 64)
  --dump-grads FILE      also write d loss / d weights under the weights' names
  Reads the first B x (T+1) tokens as B rows (T inputs, the next T tokens as targets) and
  prints `loss <x>`.

decentrain-gpt sample (--checkpoint FILE|DIR | --weights W.safetensors [--n-head H]) [options]
  --checkpoint           a checkpoint file, or a --checkpoint-dir (its newest step of peer 0)
  --prompt TEXT          encoded with the checkpoint's tokenizer (GPT-2's for 50257-id weights)
  --tokenizer NAME       gpt2 | byte, for a model that names none   --vocab DIR   as for train
  --prompt-ids I,J,...   token ids (any model)
  --tokens N             tokens to generate (default {sample_tokens})
  --temperature X        (default {temperature})   --top-k K   (default {top_k}; 0 = all)   --seed S
)";

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// --elastic over TCP: the ranks a group may hold unless --max-world says otherwise.
constexpr int elastic_max_world = 1024;

std::string usage() {
  const dt::train::trainer_options t;
  const dt::fault::checkpoint_every ck;
  const dt::nn::sample_options s;
  const dt::transport::tcp_options tcp_defaults;
  const dt::fault::elastic elastic_defaults;
  const std::pair<const char*, std::string> defaults[] = {
      {"{recv_timeout_ms}", std::to_string(tcp_defaults.recv_timeout.count())},
      {"{agreement_timeout_ms}", std::to_string(elastic_defaults.agreement.timeout.count())},
      {"{heartbeat_ms}", std::to_string(tcp_defaults.heartbeat_interval.count())},
      {"{handshake_ms}", std::to_string(tcp_defaults.handshake_timeout.count())},
      {"{silence_ms}", std::to_string(tcp_defaults.min_silence.count())},
      {"{max_world}", std::to_string(elastic_max_world)},
      {"{steps}", std::to_string(t.steps)},
      {"{batch_size}", std::to_string(t.batch_size)},
      {"{lr}", number(t.lr)},
      {"{min_lr}", t.min_lr < 0 ? "lr / 10" : number(t.min_lr)},
      {"{warmup}", t.warmup_steps < 0 ? "steps / 10" : std::to_string(t.warmup_steps)},
      {"{beta1}", number(t.beta1)},
      {"{beta2}", number(t.beta2)},
      {"{weight_decay}", number(t.weight_decay)},
      {"{grad_clip}", number(t.grad_clip)},
      {"{seed}", std::to_string(t.seed)},
      {"{stop_check_every}", std::to_string(t.stop_check_every)},
      {"{save_every}", std::to_string(ck.every)},
      {"{keep_checkpoints}", std::to_string(ck.keep_last)},
      {"{sample_tokens}", std::to_string(s.tokens)},
      {"{temperature}", number(s.temperature)},
      {"{top_k}", std::to_string(s.top_k)},
  };
  std::string text = usage_template;
  for (const auto& [key, value] : defaults)
    for (auto at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
      text.replace(at, std::strlen(key), value);
  return text;
}

// ---- options -------------------------------------------------------------------------------

// Options as --name value pairs (and bare --flags), with typed lookups that name bad values.
class options {
 public:
  options(int argc, char** argv, int first, const std::vector<std::string>& flags) {
    for (int i = first; i < argc; ++i) {
      std::string key = argv[i];
      dt::detail::check(key.rfind("--", 0) == 0, "unexpected argument '", key, "' (options start with --)");
      key = key.substr(2);
      if (std::find(flags.begin(), flags.end(), key) != flags.end()) {
        values_[key] = "1";
        continue;
      }
      dt::detail::check(i + 1 < argc, "option --", key, " needs a value");
      values_[key] = argv[++i];
    }
  }
  bool has(const std::string& k) const { return values_.count(k) != 0; }
  // A bare flag: whether it was given (and marked as known).
  bool flag(const std::string& k) const {
    used_.insert(k);
    return has(k);
  }
  std::string text(const std::string& k, const std::string& fallback) const {
    used_.insert(k);
    return has(k) ? values_.at(k) : fallback;
  }
  std::int64_t integer(const std::string& k, std::int64_t fallback) const {
    used_.insert(k);
    if (!has(k)) return fallback;
    std::size_t n = 0;
    long long v = 0;
    try { v = std::stoll(values_.at(k), &n); } catch (const std::exception&) { n = 0; }
    dt::detail::check(n == values_.at(k).size() && n > 0, "--", k, " expects an integer, got '", values_.at(k), "'");
    return v;
  }
  // An integer in [lo, hi]: a value outside is refused by name, never wrapped or truncated.
  std::int64_t integer(const std::string& k, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const {
    const auto v = integer(k, fallback);
    dt::detail::check(!has(k) || (v >= lo && v <= hi), "--", k, " must be in [", lo, ", ", hi, "], got ", v);
    return v;
  }
  double real(const std::string& k, double fallback) const {
    used_.insert(k);
    if (!has(k)) return fallback;
    std::size_t n = 0;
    double v = 0;
    try { v = std::stod(values_.at(k), &n); } catch (const std::exception&) { n = 0; }
    dt::detail::check(n == values_.at(k).size() && n > 0 && std::isfinite(v), "--", k, " expects a finite number, got '",
                      values_.at(k), "'");
    return v;
  }
  // Any option that no lookup asked for is a typo: say so rather than ignore it.
  void reject_unknown() const {
    for (const auto& [k, v] : values_)
      dt::detail::check(used_.count(k) != 0, "unknown option --", k, " (see decentrain-gpt help)");
  }

 private:
  std::map<std::string, std::string> values_;
  mutable std::set<std::string> used_;
};

// --threads N, or (0) what OpenMP would use: OMP_NUM_THREADS or all cores.
int threads(const options& opt, int fallback) {
  const auto n = opt.integer("threads", fallback, 0, 1024);
#if defined(_OPENMP)
  return n > 0 ? static_cast<int>(n) : omp_get_max_threads();
#else
  return n > 0 ? static_cast<int>(n) : 1;
#endif
}
void set_threads(int n) {
#if defined(_OPENMP)
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// ---- checkpoint folders --------------------------------------------------------------------

// DIR/peer-R-of-W, the folders fault::checkpoint_every writes, as (rank, world), ascending.
std::vector<std::pair<int, int>> peer_folders(const fs::path& dir) {
  std::vector<std::pair<int, int>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int r = -1, w = -1;
    char tail = 0;
    if (e.is_directory() && std::sscanf(e.path().filename().c_str(), "peer-%d-of-%d%c", &r, &w, &tail) == 2 && r >= 0 && r < w)
      found.emplace_back(r, w);
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string world_sizes(const std::vector<std::pair<int, int>>& folders) {
  std::set<int> worlds;
  for (const auto& f : folders) worlds.insert(f.second);
  std::string s;
  for (int w : worlds) s += (s.empty() ? "" : ", ") + std::to_string(w);
  return s;
}

// The newest checkpoint in `ck.dir` of a run of `world` peers (0: of any size, when there is
// one; `elastic`: of any sizes, as joiners' folders are), this peer's own where it has one: every
// peer's checkpoints hold the same model shape and tokenizer, so a machine that holds only its own
// peer's folder can resume.
fs::path newest_checkpoint(const dt::fault::checkpoint_every& ck, int rank, int world, bool elastic) {
  const auto folders = peer_folders(ck.dir);
  std::set<int> worlds;
  for (const auto& [r, w] : folders)
    if (world == 0 || w == world) worlds.insert(w);
  dt::detail::check(!folders.empty(), "--resume: no checkpoints in ", ck.dir, " (expected ", ck.dir,
                    "/peer-R-of-W/step-N.ckpt)");
  dt::detail::check(!worlds.empty(), "--resume: no checkpoints of a run of ", world, " peer(s) in ", ck.dir,
                    " (it holds runs of ", world_sizes(folders), ")");
  dt::detail::check(elastic || worlds.size() == 1, "--resume: ", ck.dir, " holds runs of ", world_sizes(folders),
                    " peers; use one directory per run");
  std::optional<std::tuple<int, int, std::int64_t>> best;  // (rank, world, step)
  for (const auto& [r, w] : folders) {
    if (!worlds.count(w)) continue;
    const auto steps = ck.saved_steps(r, w);
    if (steps.empty()) continue;
    if (r == rank) return ck.file(r, w, steps.back());
    if (!best || steps.back() > std::get<2>(*best)) best.emplace(r, w, steps.back());
  }
  dt::detail::check(best.has_value(), "--resume: the peer folders in ", ck.dir, " hold no step-N.ckpt files");
  return ck.file(std::get<0>(*best), std::get<1>(*best), std::get<2>(*best));
}

// ---- tokenizers and data files ---------------------------------------------------------------

// GPT-2's vocabulary folder: --vocab DIR, else $DECENTRAIN_GPT2_VOCAB, else share/decentrain/gpt2
// beside this program's installed bin/, else the one it was installed with, else the source tree's.
fs::path gpt2_vocab_dir(const options& opt) {
  if (opt.has("vocab")) return opt.text("vocab", "");
  if (const char* env = std::getenv("DECENTRAIN_GPT2_VOCAB")) return env;
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) candidates.push_back(exe.parent_path().parent_path() / "share/decentrain/gpt2");
  candidates.push_back(DECENTRAIN_GPT2_VOCAB_INSTALLED);
  candidates.push_back(DECENTRAIN_GPT2_VOCAB_SOURCE);
  for (const auto& c : candidates)
    if (fs::exists(c / "encoder.json") || fs::exists(c / "vocab.json")) return c;
  dt::detail::fail("GPT-2's vocabulary (encoder.json + vocab.bpe) is not in ", candidates.back().string(),
                   " nor where it is installed; give its folder with --vocab DIR");
}

// The tokenizer text goes through: "char" (the distinct bytes of the training text; the alphabet
// travels in checkpoints), "byte" (256 ids) or "gpt2" (GPT-2's BPE, 50257 ids, "<|endoftext|>"
// read as its special token).
struct text_tokenizer {
  std::string name;
  std::optional<dt::data::char_tokenizer> chars;
  std::optional<dt::data::gpt2_tokenizer> gpt2;

  static text_tokenizer make(const std::string& name, const options& opt, std::string_view text) {
    text_tokenizer t{name, std::nullopt, std::nullopt};
    if (name == "char") t.chars = dt::data::char_tokenizer::from_text(text);
    else if (name == "gpt2") t.gpt2 = dt::data::gpt2_tokenizer::load(gpt2_vocab_dir(opt));
    else dt::detail::check(name == "byte", "--tokenizer must be char, byte or gpt2, got '", name, "'");
    return t;
  }
  // The tokenizer a checkpoint was trained with, if it names one.
  static std::optional<text_tokenizer> of(const dt::io::checkpoint& c, const options& opt) {
    const auto name = c.text.count("tokenizer.name") ? c.text.at("tokenizer.name")
                      : c.text.count("tokenizer.alphabet") ? std::string("char") : std::string();
    if (name.empty()) return std::nullopt;
    if (name != "char") return make(name, opt, {});
    return text_tokenizer{name, dt::data::char_tokenizer(c.text.at("tokenizer.alphabet")), std::nullopt};
  }

  std::int64_t vocab_size() const { return chars ? chars->vocab_size() : gpt2 ? gpt2->vocab_size() : 256; }
  std::vector<std::int32_t> encode(std::string_view text) const {
    if (chars) return chars->encode(text);
    if (gpt2) return gpt2->encode(text);
    return dt::data::byte_tokenizer{}.encode(text);
  }
  std::string decode(const std::vector<std::int32_t>& ids) const {
    if (chars) return chars->decode(ids);
    if (gpt2) return gpt2->decode(ids);
    return dt::data::byte_tokenizer{}.decode(ids);
  }
  // What checkpoints keep of it.
  void record(std::map<std::string, std::string>& text) const {
    text["tokenizer.name"] = name;
    if (chars) text["tokenizer.alphabet"] = chars->alphabet();
  }
};

// A --data or --input value: a folder made by `prepare`, a glob ('dir/train_*.bin', sorted) or
// one file.
std::vector<fs::path> data_files(const std::string& pattern, const char* option) {
  std::vector<fs::path> files;
  if (pattern.find_first_of("*?[") == std::string::npos) {
    dt::detail::check(fs::exists(pattern), option, " ", pattern, " does not exist");
    dt::detail::check(fs::is_regular_file(pattern), option, " ", pattern, " is not a regular file");
    files.emplace_back(pattern);
    return files;
  }
  glob_t found{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &found);
  for (std::size_t i = 0; rc == 0 && i < found.gl_pathc; ++i)
    if (fs::is_regular_file(found.gl_pathv[i])) files.emplace_back(found.gl_pathv[i]);
  globfree(&found);
  dt::detail::check(!files.empty(), option, " '", pattern, "' matches no regular files");
  std::sort(files.begin(), files.end());
  return files;
}

// The tokens of llm.c shards, each checked to be a shard, in order.
std::vector<std::int32_t> read_shards(const std::vector<fs::path>& files) {
  std::vector<std::int32_t> tokens;
  for (const auto& f : files) {
    dt::detail::check(dt::io::is_token_shard(f), f.string(), " is not an llm.c token shard (every file of a glob must be)");
    const auto part = dt::io::read_token_shard(f);
    tokens.insert(tokens.end(), part.begin(), part.end());
  }
  return tokens;
}

// ---- prepare -------------------------------------------------------------------------------

// Text files to llm.c shards: each file is a document, led by <|endoftext|> as llm.c does; the
// last --val-fraction of the tokens go to val_000000.bin, the rest to train_NNNNNN.bin of at most
// --shard-tokens each; prepare.json says which tokenizer, so training and sampling use it too.
int cmd_prepare(const options& opt) {
  const std::string input = opt.text("input", ""), out = opt.text("out", ""), name = opt.text("tokenizer", "gpt2");
  const double val_fraction = opt.real("val-fraction", 0.1);
  const auto shard_tokens = opt.integer("shard-tokens", 100'000'000, 1, 0x7fffffff);
  dt::detail::check(!input.empty() && !out.empty(), "prepare needs --input TEXT (a file or a glob) and --out DIR");
  dt::detail::check(name == "gpt2" || name == "byte", "prepare's --tokenizer must be gpt2 or byte, got '", name,
                    "' (a char vocabulary comes from the text itself: train on the text with --data)");
  dt::detail::check(val_fraction >= 0 && val_fraction < 1, "--val-fraction must be in [0, 1), got ", val_fraction);
  const auto tok = text_tokenizer::make(name, opt, {});
  opt.reject_unknown();
  const auto inputs = data_files(input, "--input");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const auto f = e.path().filename().string();
    dt::detail::check(!(f.rfind("train_", 0) == 0 || f.rfind("val_", 0) == 0) || e.path().extension() != ".bin", "--out ",
                      out, " already holds shards (", f, "); remove them or choose another folder");
  }
  std::vector<std::int32_t> tokens;
  std::size_t bytes = 0;
  for (const auto& f : inputs) {
    const auto text = dt::io::read_file(f);
    bytes += text.size();
    if (tok.gpt2) tokens.push_back(tok.gpt2->end_of_text_id());
    const auto ids = tok.encode(text);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  dt::detail::check(bytes > 0, "--input ", input, " holds no text");
  const auto n_val = static_cast<std::size_t>(static_cast<double>(tokens.size()) * val_fraction);
  dt::detail::check(n_val > 0 || val_fraction == 0, "--val-fraction ", val_fraction, " of ", tokens.size(),
                    " tokens leaves no validation tokens; give more text or a larger fraction");
  const auto n_train = tokens.size() - n_val;
  fs::create_directories(out);
  std::size_t shards = 0;
  for (std::size_t at = 0; at < n_train; at += static_cast<std::size_t>(shard_tokens), ++shards) {
    const auto end = std::min(n_train, at + static_cast<std::size_t>(shard_tokens));
    char file[32];
    std::snprintf(file, sizeof file, "train_%06zu.bin", shards);
    dt::io::write_token_shard(fs::path(out) / file, {tokens.begin() + static_cast<std::ptrdiff_t>(at),
                                                     tokens.begin() + static_cast<std::ptrdiff_t>(end)});
  }
  dt::io::write_token_shard(fs::path(out) / "val_000000.bin",
                            {tokens.begin() + static_cast<std::ptrdiff_t>(n_train), tokens.end()});
  std::ostringstream meta;
  meta << "{\"tokenizer\": " << dt::io::json_quote(name) << ", \"vocab_size\": " << tok.vocab_size()
       << ", \"documents\": " << inputs.size() << ", \"text_bytes\": " << bytes << ", \"train_tokens\": " << n_train
       << ", \"val_tokens\": " << n_val << ", \"train_shards\": " << shards << "}\n";
  dt::io::write_file_atomically(fs::path(out) / "prepare.json", meta.str());
  std::printf("prepare: %zu document(s), %.2f MB of text -> %zu %s tokens: %zu training in %zu shard(s), %zu validation, in %s\n",
              inputs.size(), static_cast<double>(bytes) / 1e6, tokens.size(), name.c_str(), n_train, shards, n_val,
              out.c_str());
  return 0;
}

// ---- memory --------------------------------------------------------------------------------

// Refuses, before anything is allocated, a run that cannot fit in this machine's memory: a bare
// std::bad_alloc (or the kernel's OOM killer) would name nothing. The figure is a lower bound
// (weights, gradients and AdamW's two moments; the residual stream, the MLP's hidden layer and
// the logits), so a run that fits is never refused.
void check_fits_in_memory(const dt::nn::gpt_config& cfg, std::int64_t batch, int peers) {
  const double C = static_cast<double>(cfg.n_embd), L = static_cast<double>(cfg.n_layer),
               T = static_cast<double>(cfg.block_size), V = static_cast<double>(cfg.vocab_size),
               B = static_cast<double>(batch);
  const double params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  const double state = 16 * params;
  const double activations = 4 * B * T * (L * 5 * C + V);
  const double need = peers * (state + activations);
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const auto figure = [](double v) {  // three digits: these are estimates
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return std::string(buf);
  };
  const auto gb = [&](double bytes) { return figure(bytes / 1e9) + " GB"; };
  dt::detail::check(need <= have, "this run needs at least ", gb(need), " of memory, more than this machine's ", gb(have), ": ",
                    peers > 1 ? std::to_string(peers) + " peers, each with " : std::string(), gb(state),
                    " for the weights, gradients and AdamW state of ", figure(params), " parameters (--n-layer ",
                    cfg.n_layer, ", --n-embd ", cfg.n_embd, ", vocabulary ", cfg.vocab_size, ") and ", gb(activations),
                    " of activations (--batch-size ", batch, " x --block-size ", cfg.block_size, ")");
}

// ---- train ---------------------------------------------------------------------------------

struct training_data {
  dt::data::token_dataset dataset;
  std::optional<text_tokenizer> tokenizer;  // unknown for shards that `prepare` did not make
  std::int64_t vocab_size;
  std::string source;
};

// --data: text (tokenized here: --tokenizer char, byte or gpt2), llm.c shards (a file, a glob,
// or a folder from `prepare`: its train_*.bin, with val_*.bin as the validation split), or
// nothing: the built-in corpus.
training_data load_training_data(const options& opt, std::int64_t preset_vocab, const dt::io::checkpoint* resume) {
  const double val_fraction = opt.real("val-fraction", 0.1);
  std::string path = opt.text("data", "");
  std::string val_path = opt.text("val-data", "");
  const std::string tokenizer_name = opt.text("tokenizer", "");
  dt::detail::check(val_fraction >= 0 && val_fraction < 1, "--val-fraction must be in [0, 1), got ", val_fraction);
  std::optional<dt::io::json_value> prepared;  // prepare.json of a folder made by `prepare`
  if (!path.empty() && fs::is_directory(path)) {
    const auto meta = fs::path(path) / "prepare.json";
    dt::detail::check(fs::exists(meta), "--data ", path, " is a folder without prepare.json (made by decentrain-gpt prepare); ",
                      "name its shards with a glob instead, as '", (fs::path(path) / "train_*.bin").string(), "'");
    prepared = dt::io::parse_json(dt::io::read_file(meta));
    if (val_path.empty()) val_path = (fs::path(path) / "val_*.bin").string();
    path = (fs::path(path) / "train_*.bin").string();
  }
  const auto files = path.empty() ? std::vector<fs::path>{} : data_files(path, "--data");
  if (!prepared && !files.empty() && fs::exists(files[0].parent_path() / "prepare.json"))
    prepared = dt::io::parse_json(dt::io::read_file(files[0].parent_path() / "prepare.json"));
  if (!files.empty() && dt::io::is_token_shard(files[0])) {
    auto tokens = read_shards(files);
    const std::string name = prepared ? prepared->at("tokenizer").as_string() : tokenizer_name;
    dt::detail::check(tokenizer_name.empty() || tokenizer_name == name, "--tokenizer ", tokenizer_name, " contradicts ",
                      "prepare.json beside the shards, which says ", name);
    dt::detail::check(name != "char", "--tokenizer char is for text: shards hold ids already (use gpt2 or byte)");
    auto tok = resume ? text_tokenizer::of(*resume, opt) : std::nullopt;
    dt::detail::check(!tok || name.empty() || tok->name == name, "the checkpoint was trained with the ",
                      tok ? tok->name : "", " tokenizer, these shards are ", name);
    const auto vocab = opt.integer("vocab-size", prepared ? prepared->at("vocab_size").as_int() : name == "gpt2" ? 50257 : preset_vocab);
    if (!tok && !name.empty()) tok = text_tokenizer::make(name, opt, {});
    dt::detail::check(!tok || tok->vocab_size() <= vocab, "--vocab-size ", vocab, " is smaller than the ", name,
                      " tokenizer's ", tok ? tok->vocab_size() : 0);
    const auto check_range = [&](const std::vector<std::int32_t>& t, const std::string& what) {
      for (std::size_t i = 0; i < t.size(); ++i)
        dt::detail::check(t[i] < vocab, "token ", t[i], " at index ", i, " of ", what, " is outside the vocabulary of ", vocab,
                          " (set --vocab-size)");
    };
    check_range(tokens, path);
    std::string source = path + " (" + std::to_string(files.size()) + " token shard" + (files.size() > 1 ? "s" : "") +
                         (name.empty() ? "" : ", " + name) + ")";
    if (val_path.empty())
      return {dt::data::token_dataset(std::move(tokens), val_fraction), std::move(tok), vocab, source};
    dt::detail::check(!opt.has("val-fraction"), "--val-fraction does not apply: the validation split is ", val_path);
    auto val = read_shards(data_files(val_path, "--val-data"));
    check_range(val, val_path);
    return {dt::data::token_dataset(std::move(tokens), std::move(val)), std::move(tok), vocab, source + ", validation " + val_path};
  }
  dt::detail::check(val_path.empty(), "--val-data goes with token shards in --data");
  std::string text;
  if (files.empty()) {
    text = dt::data::builtin_corpus();
  } else {
    for (const auto& f : files) text += dt::io::read_file(f);
    dt::detail::check(!text.empty(), "--data ", path, " is empty");
  }
  // A resumed run keeps the tokenizer it started with.
  auto tok = resume ? text_tokenizer::of(*resume, opt) : std::nullopt;
  if (!tok) tok = text_tokenizer::make(tokenizer_name.empty() ? "char" : tokenizer_name, opt, text);
  dt::detail::check(tokenizer_name.empty() || tokenizer_name == tok->name, "--tokenizer ", tokenizer_name,
                    " contradicts the checkpoint's tokenizer, ", tok->name);
  auto tokens = tok->encode(text);
  const auto vocab = tok->vocab_size();
  std::string source = files.empty() ? std::string("built-in corpus") : path + " (text, " + tok->name + " tokenizer)";
  return {dt::data::token_dataset(std::move(tokens), val_fraction), std::move(tok), vocab, std::move(source)};
}

// --compute-dtype f32|bf16 (mixed precision).
dt::dtype compute_dtype(const options& opt) {
  const std::string name = opt.text("compute-dtype", "f32");
  if (name == "f32") return dt::dtype::f32;
  if (name == "bf16") return dt::dtype::bf16;
  dt::detail::fail("--compute-dtype must be f32 or bf16, got '", name, "'");
}

// The model shape from --preset and its overrides (the vocabulary comes from the data).
dt::nn::gpt_config model_config(const options& opt) {
  auto cfg = dt::nn::gpt_preset(opt.text("preset", "tiny"));
  cfg.n_layer = opt.integer("n-layer", cfg.n_layer, 1, 4096);
  cfg.n_head = opt.integer("n-head", cfg.n_head, 1, 1 << 16);
  cfg.n_embd = opt.integer("n-embd", cfg.n_embd, 1, 1 << 20);
  cfg.block_size = opt.integer("block-size", cfg.block_size, 1, 1 << 24);
  cfg.dropout = opt.real("dropout", cfg.dropout);
  cfg.bias = !opt.flag("no-bias");
  return cfg;
}

// The trainer's settings; every default not named here is trainer_options{}'s.
dt::train::trainer_options trainer_settings(const options& opt) {
  dt::train::trainer_options t;
  t.steps = opt.integer("steps", t.steps, 1, std::int64_t{1} << 40);
  t.batch_size = opt.integer("batch-size", t.batch_size, 1, 1 << 24);
  t.lr = opt.real("lr", t.lr);
  t.min_lr = opt.real("min-lr", t.min_lr);
  t.warmup_steps = opt.integer("warmup", t.warmup_steps);
  t.beta1 = opt.real("beta1", t.beta1);
  t.beta2 = opt.real("beta2", t.beta2);
  t.weight_decay = opt.real("weight-decay", t.weight_decay);
  t.grad_clip = opt.real("grad-clip", t.grad_clip);
  t.stop_on_non_finite = !opt.flag("allow-non-finite");
  t.seed = static_cast<std::uint64_t>(opt.integer("seed", static_cast<std::int64_t>(t.seed)));
  t.eval_every = opt.integer("eval-every", 250);
  t.eval_batches = opt.integer("eval-batches", 20);
  t.compute_dtype = compute_dtype(opt);
  t.collectives.link_bytes_in_flight = opt.real("link-in-flight", 0.0) * 1e6;
  dt::detail::check(t.collectives.link_bytes_in_flight >= 0, "--link-in-flight must be >= 0 (MB)");
  t.validate();
  return t;
}

// How this process takes part: alone, as --peers threads, as one TCP peer, or as an MPI rank.
enum class launch { single, in_process, tcp, mpi };
const char* launch_name(launch l) {
  switch (l) {
    case launch::single: return "single";
    case launch::in_process: return "in-process";
    case launch::tcp: return "tcp";
    case launch::mpi: return "mpi";
  }
  return "?";
}

struct train_plan {
  launch mode = launch::single;
  int world = 1;  // 0 for MPI until it starts
  int threads = 1;  // per peer
  std::string link;  // --peers: the simulated links
  dt::transport::tcp_options tcp;
  dt::nn::gpt_config model;
  dt::train::trainer_options trainer;
  dt::fault::checkpoint_every checkpoints;
  bool elastic = false;
  dt::fault::elastic elastic_policy;
  std::vector<std::pair<int, std::int64_t>> kills;  // --kill: (rank, after steps)
  std::string metrics;  // '' for none
  dt::collective::any_aggregator aggregator;
  dt::train::json_line run;  // the metrics' config line, beyond the trainer's own fields
};

// Over TCP or MPI every process writes its own metrics: "{rank}" in the path becomes the rank,
// or, with several peers, ".rank-R" goes before the extension.
std::string metrics_path(const std::string& path, int rank, int world) {
  std::string out = path;
  if (const auto at = out.find("{rank}"); at != std::string::npos) return out.replace(at, 6, std::to_string(rank));
  if (world == 1) return out;
  fs::path p(out);
  return p.replace_filename(p.stem().string() + ".rank-" + std::to_string(rank) + p.extension().string()).string();
}

// The fault policy restores inside fit(); a peer's first step says from which step it resumed
// (an elastic peer behind the others, or one that joined a running group, took their state).
template <class Trainer>
void announce_resume(Trainer& t) {
  const int rank = t.rank(), world = t.world();  // before fit: the whole world's, as the folders are named
  t.on_step([&t, rank, world, first = true](const dt::train::step_metrics& m) mutable {
    if (!first) return;
    first = false;
    const auto from = m.step - 1;
    if (from <= 0) return;
    const dt::fault::checkpoint_every* ck = nullptr;
    bool took_state = false;
    if constexpr (requires { t.fault().checkpoints; }) {  // elastic
      ck = &t.fault().checkpoints;
      took_state = !t.fault().changes().empty() && t.fault().changes().front().healed;
    } else {
      ck = &t.fault();
    }
    if (took_state)
      std::printf("peer %d resumed at step %lld from the others' state\n", rank, static_cast<long long>(from));
    else
      std::printf("peer %d resumed from %s at step %lld\n", rank, ck->file(rank, world, from).c_str(),
                  static_cast<long long>(from));
    std::fflush(stdout);
  });
}

void print_summary(const train_plan& p, const std::vector<dt::train::fit_result>& results, int first_rank, int world,
                   const char* comm, double wall_s) {
  // Compute utilisation: the share of the peer's clock (simulated for --peers) spent computing
  // steps rather than waiting on the network or evaluating. Send rates: the mean over the run and
  // the peak over any second of the clock.
  std::printf("\n%-6s %-10s %-14s %-14s %-12s %-12s %-12s %-8s %-10s %-10s\n", "peer", "val loss", "MB sent", "MB received",
              "net wait s", "compute s", "clock s", "util %", "MB/s mean", "MB/s peak");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& m = results[i].last;
    std::printf("%-6zu %-10.4f %-14.2f %-14.2f %-12.2f %-12.2f %-12.2f %-8.1f %-10.3f %-10.3f\n", i + static_cast<std::size_t>(first_rank),
                results[i].final_val_loss, static_cast<double>(m.bytes_sent) / 1e6, static_cast<double>(m.bytes_received) / 1e6,
                m.network_wait_s, m.compute_s, m.clock_s, 100.0 * m.utilisation(), m.mean_send_rate() / 1e6,
                m.peak_send_rate / 1e6);
  }
  if (world > 1) {
    // What a synchronous all-reduce of the gradient every step would have put on the wire per
    // peer (ring all-reduce: 2 (N-1)/N times the gradient's bytes), for comparison.
    const double grad_bytes = 4.0 * static_cast<double>(p.model.parameter_count());
    const double sync_bytes = static_cast<double>(p.trainer.steps) * 2.0 * (world - 1) / world * grad_bytes;
    const double sent = static_cast<double>(results[0].last.bytes_sent);
    std::printf("\ncomm %s: %.2f MB sent per peer; synchronous all-reduce every step would send %.2f MB (%.1fx more)\n", comm,
                sent / 1e6, sync_bytes / 1e6, sent > 0 ? sync_bytes / sent : 0.0);
  }
  std::printf("val loss %.4f\n", results[0].final_val_loss);
  std::printf("trained in %s\n", dt::train::format_duration(wall_s).c_str());
}

// The peers whose contributions were left out (non-finite, malformed) or lay far from the
// aggregate, as one peer saw them (ranks of its replica group; after a membership change they
// are the current view's).
void print_suspects(const dt::collective::peer_tally& t) {
  for (std::size_t r = 0; r < t.non_finite.size(); ++r) {
    if (t.suspicious(r) == 0) continue;
    std::printf("peer %zu's contributions: %lld of %lld left out for NaN or infinite values, %lld malformed, %lld more "
                "than %gx the typical distance from the aggregate\n",
                r, static_cast<long long>(t.non_finite[r]), static_cast<long long>(t.calls),
                static_cast<long long>(t.malformed[r]), static_cast<long long>(t.far[r]), t.far_factor);
  }
}

// What an elastic group went through, as one survivor saw it.
void print_changes(const std::vector<dt::fault::membership_change>& changes) {
  if (changes.empty()) {
    std::printf("membership: no changes\n");
    return;
  }
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int r : v) {
      if (!out.empty()) out += ',';
      out += std::to_string(r);
    }
    return out.empty() ? std::string("none") : out;
  };
  for (const auto& c : changes)
    std::printf("membership: view %llu from step %lld: peers %s (left out: %s, joined: %s)%s, %.3f s after '%s'\n",
                static_cast<unsigned long long>(c.epoch), static_cast<long long>(c.step), list(c.members).c_str(),
                list(c.removed).c_str(), list(c.joined).c_str(), c.healed ? ", took a peer's state" : "", c.seconds,
                c.cause.c_str());
}

// The one training loop of every mode: the library's trainer, one per peer of this process,
// with the same hooks (progress on rank 0, metrics, Ctrl-C) everywhere.
template <class Fault, class Comm>
int train(const train_plan& p, const training_data& data, Comm comm, Fault fault) {
  constexpr bool elastic = std::is_same_v<Fault, dt::fault::elastic>;
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm, dt::parallel::data, Fault>;
  dt::train::progress bar(stdout, ::isatty(STDOUT_FILENO) != 0);
  std::ofstream metrics_file;
  std::optional<dt::train::metrics_log> metrics;
  auto open_metrics = [&](const std::string& path) {
    if (path.empty()) return;
    metrics_file.open(path, p.checkpoints.resume ? std::ios::app : std::ios::trunc);
    dt::detail::check(metrics_file.good(), "cannot open --metrics file ", path);
    metrics.emplace(metrics_file, p.run);
  };
  std::vector<std::int64_t> asked_at;  // per rank: the step at which stop_when last asked
  std::vector<dt::collective::peer_tally> tallies;  // per rank: what it saw of the others' contributions
  std::vector<std::vector<dt::fault::membership_change>> changes;
  std::optional<dt::transport::in_process> network;  // --peers
  auto setup = [&](Trainer& t) {
    if (p.checkpoints.resume) announce_resume(t);
    if (metrics) metrics->attach(t);
    if (t.rank() == 0) bar.attach(t);
    if constexpr (elastic) {
      for (const auto& [victim, after] : p.kills)
        if (victim == t.rank())
          t.on_step([&t, &network, after = after](const dt::train::step_metrics& m) {
            if (m.step != after || !network) return;
            std::printf("\n--kill: peer %d killed after step %lld\n", t.rank(), static_cast<long long>(m.step));
            std::fflush(stdout);
            network->kill(t.members()[static_cast<std::size_t>(t.rank())]);
            dt::detail::fail("peer killed by --kill");
          });
      auto keep_changes = [&t, &changes] {
        const auto r = static_cast<std::size_t>(t.members()[static_cast<std::size_t>(t.rank())]);
        if (t.fault().changes().size() != changes[r].size()) changes[r] = t.fault().changes();
      };
      t.on_step([keep_changes](const dt::train::step_metrics&) { keep_changes(); });
      t.on_eval([keep_changes](const dt::train::eval_point&) { keep_changes(); });
    }
    t.on_step([&t, &tallies](const dt::train::step_metrics& m) {
      tallies[static_cast<std::size_t>(m.rank)] = t.policy().aggregation().tally;
    });
    t.stop_when([&t, &at = asked_at[static_cast<std::size_t>(t.rank())]] {
      at = t.step();
      return interrupted.load();
    });
  };

  std::vector<dt::train::fit_result> results;
  int world = p.world, rank = 0;
  int asker = 0;  // whose asked_at says where a stop happened: this process's peer, or the first survivor
  const auto t0 = std::chrono::steady_clock::now();
  if (p.mode == launch::single || p.mode == launch::in_process) {
    open_metrics(p.metrics);  // one file, one log, for every peer
    auto links = p.mode == launch::single ? dt::transport::links::ideal(1)
                                          : dt::transport::links::preset(p.link, world, p.trainer.seed);
    network.emplace(std::move(links), dt::transport::in_process::options{p.trainer.seed, std::chrono::minutes(10), elastic});
    asked_at.assign(static_cast<std::size_t>(world), 0);
    tallies.assign(static_cast<std::size_t>(world), {});
    changes.assign(static_cast<std::size_t>(world), {});
    std::signal(SIGINT, on_interrupt);
    results = dt::train::fit_in_process<Trainer>(*network, p.model, p.trainer, data.dataset, comm, setup, p.threads, {},
                                                 fault);
  } else {
#if DECENTRAIN_HAS_MPI
    std::optional<dt::transport::mpi_environment> mpi_env;  // outlives the endpoint and the trainer
#endif
    std::optional<dt::transport::any_endpoint> ep;
    if (p.mode == launch::tcp) {
      std::printf("tcp peer %d of %d listening on %s%s\n", p.tcp.rank, p.tcp.world, p.tcp.listen.c_str(),
                  p.tcp.key.empty() ? "" : " (run key: peers and frames authenticated)");
      std::fflush(stdout);
      if (p.tcp.key.empty())
        std::fprintf(stderr,
                     "warning: no run key (--key-file or %s): anyone who can reach %s can join this group and "
                     "send it anything a peer may send\n",
                     dt::transport::auth::key_file_variable, p.tcp.listen.c_str());
      ep.emplace(dt::transport::tcp::join(p.tcp));
    } else {
#if DECENTRAIN_HAS_MPI
      mpi_env.emplace(nullptr, nullptr);
      ep.emplace(dt::transport::mpi());
#else
      dt::detail::fail("--mpi: this decentrain-gpt was built without MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    world = ep->world();
    rank = asker = ep->rank();
    open_metrics(metrics_path(p.metrics, rank, world));  // a file per process
    set_threads(p.threads);
    Trainer t(p.model, p.trainer, *ep, comm, {}, fault);
    asked_at.assign(static_cast<std::size_t>(world), 0);
    tallies.assign(static_cast<std::size_t>(world), {});
    changes.assign(static_cast<std::size_t>(world), {});
    setup(t);
    std::signal(SIGINT, on_interrupt);
    results.push_back(t.fit(data.dataset));
    if constexpr (elastic) {
      changes[static_cast<std::size_t>(rank)] = t.fault().changes();
      rank = t.rank();  // in the last view: its rank 0 reports
      world = t.world();
    }
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if constexpr (elastic) {
    // In-process: the killed peers have no results; the survivors report, the first of them
    // listing the group's changes. Over TCP each process lists what it saw.
    std::vector<dt::train::fit_result> kept;
    int first = -1;
    for (std::size_t r = 0; r < results.size(); ++r) {
      if (p.mode == launch::in_process && network->killed(static_cast<int>(r))) continue;
      if (first < 0) first = static_cast<int>(r);
      kept.push_back(results[r]);
    }
    if (p.mode == launch::in_process) {
      dt::detail::check(first >= 0, "--elastic: no peer survived");
      for (std::size_t r = 0; r < results.size(); ++r)
        if (network->killed(static_cast<int>(r))) {
          const auto why = network->failure(static_cast<int>(r));
          if (why.empty()) std::printf("peer %zu was killed\n", r);
          else std::printf("peer %zu failed and was left out: %s\n", r, why.c_str());
        }
      print_changes(changes[static_cast<std::size_t>(first)]);
      results = kept;
      world = static_cast<int>(kept.size());
      asker = first;
    } else {
      print_changes(changes[static_cast<std::size_t>(p.tcp.rank)]);
    }
  }
  if (results[0].stopped) {
    const auto step = asked_at[static_cast<std::size_t>(asker)];
    const int folders_of = p.mode == launch::in_process ? p.world : world;  // survivors keep their folders' names
    if (elastic && p.mode == launch::tcp) {
      const auto file = p.checkpoints.file(p.tcp.rank, std::max(p.tcp.world, p.tcp.rank + 1), step);
      std::printf("\ninterrupted at step %lld: left the group; checkpoint saved to %s\n", static_cast<long long>(step),
                  file.c_str());
      std::printf("come back with --checkpoint-dir %s --resume (a running group gives its own state instead)\n",
                  p.checkpoints.dir.c_str());
      return 130;
    }
    if (folders_of == 1)
      std::printf("\ninterrupted at step %lld: checkpoint saved to %s\n", static_cast<long long>(step),
                  p.checkpoints.file(0, 1, step).c_str());
    else
      std::printf("\ninterrupted at step %lld: checkpoint saved to %s (each peer's in peer-R-of-%d/step-%lld.ckpt)\n",
                  static_cast<long long>(step), p.checkpoints.dir.c_str(), folders_of, static_cast<long long>(step));
    std::printf("continue with --checkpoint-dir %s --resume\n", p.checkpoints.dir.c_str());
    return 130;
  }
  // Over TCP or MPI only this process's own figures are known; rank 0 reports them.
  if (rank == 0) {
    print_summary(p, results, rank, world, Comm::name, wall_s);
    print_suspects(tallies[static_cast<std::size_t>(asker)]);
  }
  return 0;
}

// The fault policy the plan asks for: elastic, or checkpoints.
template <class Comm>
int train_with(const train_plan& p, const training_data& data, Comm comm) {
  if (p.elastic) {
    auto elastic = p.elastic_policy;
    elastic.checkpoints = p.checkpoints;
    return train(p, data, comm, elastic);
  }
  return train(p, data, comm, p.checkpoints);
}

int cmd_train(const options& opt) {
  train_plan p;
  const int modes = int(opt.has("peers")) + int(opt.has("listen")) + int(opt.has("mpi"));
  dt::detail::check(modes <= 1, "--peers, --listen and --mpi are different modes; give one of them");
  p.mode = opt.has("peers")    ? launch::in_process
           : opt.has("listen") ? launch::tcp
           : opt.flag("mpi")   ? launch::mpi
                               : launch::single;
  if (p.mode != launch::in_process)
    dt::detail::check(!opt.has("link"), "--link sets the simulated links of --peers N; it needs --peers");
  if (p.mode != launch::tcp)
    for (const char* o : {"join", "advertise", "rank", "world", "join-timeout-ms", "peer-timeout-ms", "heartbeat-ms", "silence-ms",
                          "max-world", "key-file", "handshake-timeout-ms"})
      dt::detail::check(!opt.has(o), "--", o, " is for TCP peers; it needs --listen HOST:PORT");
  p.threads = threads(opt, p.mode == launch::single ? 0 : 1);
  if (p.mode == launch::in_process) {
    const auto n = opt.integer("peers", 4, 1, 256);
    p.world = static_cast<int>(n);
    p.link = opt.text("link", "lan");
  } else if (p.mode == launch::tcp) {
    p.tcp.listen = opt.text("listen", "");
    p.tcp.advertise = opt.text("advertise", "");
    p.tcp.join = split_list(opt.text("join", ""));
    p.tcp.rank = static_cast<int>(opt.integer("rank", 0, 0, 65535));
    p.tcp.world = static_cast<int>(opt.integer("world", 1, 1, 65536));
    p.tcp.join_timeout = std::chrono::milliseconds(opt.integer("join-timeout-ms", 60000, 1, 86'400'000));
    const auto peer_timeout = opt.integer("peer-timeout-ms", p.tcp.recv_timeout.count());
    dt::detail::check(peer_timeout >= 1, "--peer-timeout-ms must be >= 1, got ", peer_timeout);
    p.tcp.recv_timeout = std::chrono::milliseconds(peer_timeout);
    const auto heartbeat = opt.integer("heartbeat-ms", p.tcp.heartbeat_interval.count());
    dt::detail::check(heartbeat >= 0, "--heartbeat-ms must be >= 0 (0: no heartbeats), got ", heartbeat);
    p.tcp.heartbeat_interval = std::chrono::milliseconds(heartbeat);
    const auto silence = opt.integer("silence-ms", p.tcp.min_silence.count());
    dt::detail::check(silence >= 1, "--silence-ms must be >= 1, got ", silence);
    dt::detail::check(heartbeat > 0 || !opt.has("silence-ms"), "--silence-ms needs heartbeats (--heartbeat-ms above 0)");
    p.tcp.min_silence = std::chrono::milliseconds(silence);
    const auto handshake = opt.integer("handshake-timeout-ms", p.tcp.handshake_timeout.count());
    dt::detail::check(handshake >= 1, "--handshake-timeout-ms must be >= 1, got ", handshake);
    p.tcp.handshake_timeout = std::chrono::milliseconds(handshake);
    // Never on the command line, where `ps` shows it to every user of the machine.
    p.tcp.key = opt.has("key-file") ? dt::transport::auth::read_key_file(opt.text("key-file", ""))
                                    : dt::transport::auth::key_from_environment();
    if (opt.flag("elastic")) {
      const auto most = opt.integer("max-world", elastic_max_world);
      dt::detail::check(most >= p.tcp.world && most <= 65536, "--max-world must be in [--world, 65536], got ", most);
      p.tcp.max_world = static_cast<int>(most);
    } else {
      dt::detail::check(!opt.has("max-world"), "--max-world needs --elastic (only an elastic group takes in joiners)");
    }
    p.tcp.validate();
    p.world = p.tcp.world;
  } else if (p.mode == launch::mpi) {
    p.world = 0;
  }
  p.trainer = trainer_settings(opt);

  // Checkpoints: DIR/peer-R-of-W/step-N.ckpt in every mode; without a directory only Ctrl-C
  // saves, to ./checkpoints.
  const std::string dir = opt.text("checkpoint-dir", "");
  const auto save_every = opt.integer("save-every", p.checkpoints.every);
  const auto keep = opt.integer("keep-checkpoints", p.checkpoints.keep_last);
  dt::detail::check(save_every >= 0, "--save-every must be >= 0 (0: only on Ctrl-C), got ", save_every);
  dt::detail::check(keep >= 1 && keep <= 1000000, "--keep-checkpoints must be >= 1, got ", keep);
  p.checkpoints.dir = dir.empty() ? "checkpoints" : dir;
  p.checkpoints.every = dir.empty() ? 0 : save_every;
  p.checkpoints.keep_last = static_cast<int>(keep);
  p.checkpoints.resume = opt.flag("resume");
  dt::detail::check(!p.checkpoints.resume || !dir.empty(),
                    "--resume needs --checkpoint-dir (Ctrl-C without one saves to ./checkpoints)");
  p.metrics = opt.text("metrics", "metrics.jsonl");
  p.elastic = opt.flag("elastic");
  if (p.elastic) {
    dt::detail::check(p.mode == launch::in_process || p.mode == launch::tcp,
                      "--elastic needs --peers N or --listen HOST:PORT (under MPI a dead rank ends the job unless the MPI "
                      "library has ULFM)");
    // Ctrl-C on one TCP peer: it leaves and the others go on; in-process peers stop together.
    p.trainer.stop_alone = p.mode == launch::tcp;
    const auto t = opt.integer("agreement-timeout-ms", p.elastic_policy.agreement.timeout.count());
    dt::detail::check(t >= 1, "--agreement-timeout-ms must be >= 1, got ", t);
    p.elastic_policy.agreement.timeout = std::chrono::milliseconds(t);
    // How long a survivor may wait on a frozen peer before it notices and joins the agreement.
    const bool beats = p.tcp.heartbeat_interval.count() > 0;
    const auto frozen_found_in = beats ? p.tcp.min_silence : p.tcp.recv_timeout;
    dt::detail::check(p.mode != launch::tcp || p.elastic_policy.agreement.timeout > frozen_found_in,
                      "--agreement-timeout-ms (", t, ") must be more than ", beats ? "--silence-ms (" : "--peer-timeout-ms (",
                      frozen_found_in.count(), "): a peer may wait that long on a frozen one before it joins the agreement");
    for (const auto& k : split_list(opt.text("kill", ""))) {
      const auto at = k.find('@');
      dt::detail::check(p.mode == launch::in_process, "--kill needs --peers N (kill a TCP peer with kill -9)");
      dt::detail::check(at != std::string::npos && at > 0 && at + 1 < k.size() &&
                            k.find_first_not_of("0123456789@") == std::string::npos,
                        "--kill takes RANK@STEP, got '", k, "'");
      const int victim = std::stoi(k.substr(0, at));
      const auto after = std::stoll(k.substr(at + 1));
      dt::detail::check(victim >= 0 && victim < p.world, "--kill: rank ", victim, " is outside --peers ", p.world);
      dt::detail::check(after >= 1 && after < p.trainer.steps, "--kill: step ", after, " must be in [1, --steps)");
      p.kills.emplace_back(victim, after);
    }
  } else {
    for (const char* o : {"agreement-timeout-ms", "kill"})
      dt::detail::check(!opt.has(o), "--", o, " needs --elastic");
  }

  const std::string comm = opt.text("comm", p.mode == launch::single ? "sync" : "diloco");
  dt::detail::check(comm == "sync" || comm == "local-sgd" || comm == "diloco" || comm == "streaming-diloco",
                    "--comm must be sync, local-sgd, diloco or streaming-diloco, got '", comm, "'");
  const bool streaming = comm == "streaming-diloco";
  dt::detail::check(streaming || !opt.has("fragments"), "--fragments needs --comm streaming-diloco");
  dt::detail::check(streaming || comm == "diloco" || !opt.has("overlap"), "--overlap needs --comm diloco or streaming-diloco");
  dt::detail::check(streaming || opt.has("overlap") || !opt.has("mix"), "--mix needs --overlap or --comm streaming-diloco");
  const bool eager = opt.flag("eager");
  dt::detail::check(streaming || comm == "diloco" || !eager, "--eager needs --comm diloco or streaming-diloco");
  dt::detail::check(!eager || (!opt.has("overlap") && !opt.has("mix")),
                    "--eager overlaps each exchange with a whole round and steps at once: --overlap and --mix do not apply");
  const auto fragments = streaming ? opt.integer("fragments", 4) : 1;
  const auto overlap = opt.integer("overlap", streaming ? 1 : 0);
  const double mix = opt.real("mix", 0.5);
  const auto inner = comm == "sync" ? 1 : opt.integer("inner-steps", 50);
  const auto codec_choice = dt::compress::parse_codec(opt.text("codec", "identity"));
  p.aggregator = dt::collective::parse_aggregator(opt.text("aggregator", "mean"));
  dt::detail::check(!p.aggregator.per_partition() || codec_choice.describe() == "identity", "--aggregator '",
                    p.aggregator.describe(), "' aggregates per partition, which sends f32 values: it needs --codec identity, not '",
                    codec_choice.describe(), "'");
  const bool outer = comm == "diloco" || streaming;
  const double outer_lr = outer ? opt.real("outer-lr", 0.7) : 0.0;
  const double outer_momentum = outer ? opt.real("outer-momentum", 0.9) : 0.0;

  // A resumed run takes the model's shape and the tokenizer from its checkpoints.
  std::optional<dt::io::checkpoint> resumed;
  if (p.checkpoints.resume)
    resumed = dt::io::load_checkpoint(
        newest_checkpoint(p.checkpoints, p.mode == launch::tcp ? p.tcp.rank : 0, p.elastic ? 0 : p.world, p.elastic));
  p.model = model_config(opt);
  auto data = load_training_data(opt, p.model.vocab_size, resumed ? &*resumed : nullptr);
  opt.reject_unknown();
  p.model.vocab_size = data.vocab_size;
  if (resumed) p.model = dt::train::config_of(*resumed);
  if (data.tokenizer) data.tokenizer->record(p.checkpoints.text);
  check_fits_in_memory(p.model, p.trainer.batch_size, p.mode == launch::in_process ? p.world : 1);
  // Both splits must hold a block and its next token, or the run would fail at its first evaluation.
  for (const auto s : {dt::data::split::train, dt::data::split::validation}) {
    const auto n = data.dataset.tokens(s).size();
    dt::detail::check(static_cast<std::int64_t>(n) > p.model.block_size, "the ",
                      s == dt::data::split::train ? "training" : "validation", " split of ", data.source, " holds ", n,
                      " tokens, fewer than --block-size + 1 = ", p.model.block_size + 1,
                      " (give more data, a larger --val-fraction or a smaller --block-size)");
  }

  p.run.add("program", "decentrain-gpt")
      .add("mode", launch_name(p.mode))
      .add("data", data.source)
      .add("n_layer", p.model.n_layer)
      .add("n_head", p.model.n_head)
      .add("n_embd", p.model.n_embd)
      .add("block_size", p.model.block_size)
      .add("vocab_size", p.model.vocab_size)
      .add("dropout", p.model.dropout)
      .add("eval_every", p.trainer.eval_every)
      .add("eval_batches", p.trainer.eval_batches)
      .add("threads_per_peer", p.threads)
      .add("resume", p.checkpoints.resume);
  if (p.mode == launch::in_process) p.run.add("link", p.link);
  if (comm != "sync") p.run.add("inner_steps", inner);
  p.run.add("codec", codec_choice.describe()).add("aggregator", p.aggregator.describe());
  if (outer) p.run.add("outer_lr", outer_lr).add("outer_momentum", outer_momentum);
  if (eager) p.run.add("fragments", fragments).add("eager", true);
  else if (streaming || overlap > 0) p.run.add("fragments", fragments).add("overlap", overlap).add("mix", mix);

  const auto& cfg = p.model;
  std::printf("model: %lld layers, %lld heads, width %lld, block %lld, vocab %lld: %.2fM parameters\n",
              static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.block_size), static_cast<long long>(cfg.vocab_size),
              static_cast<double>(cfg.parameter_count()) / 1e6);
  std::printf("data: %s, %zu training and %zu validation tokens\n", data.source.c_str(),
              data.dataset.tokens(dt::data::split::train).size(), data.dataset.tokens(dt::data::split::validation).size());
  if (p.mode == launch::in_process)
    std::printf("%d in-process peers over simulated '%s' links, %d thread(s) each\n", p.world, p.link.c_str(), p.threads);
  std::fflush(stdout);

  // One trainer type per policy, whatever the codec and aggregator: any_codec and any_aggregator
  // choose them at run time.
  using codec = dt::compress::any_codec;
  using aggregator = dt::collective::any_aggregator;
  if (comm == "sync") {
    dt::comm::sync_allreduce<codec, aggregator> policy;
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    return train_with(p, data, policy);
  }
  if (comm == "local-sgd") {
    dt::comm::local_sgd<codec, aggregator> policy;
    policy.inner_steps = inner;
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    return train_with(p, data, policy);
  }
  if (streaming || overlap > 0 || eager) {  // DiLoCo with overlap is Streaming DiLoCo with one fragment
    dt::comm::streaming_diloco<dt::comm::outer::nesterov, codec, aggregator> policy;
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    policy.inner_steps = inner;
    policy.fragments = fragments;
    policy.overlap = overlap;
    policy.mix = mix;
    policy.eager = eager;
    policy.outer_optimizer.lr = outer_lr;
    policy.outer_optimizer.momentum = outer_momentum;
    return train_with(p, data, policy);
  }
  dt::comm::diloco<dt::comm::outer::nesterov, codec, aggregator> policy;
  policy.codec = codec_choice;
  policy.aggregator = p.aggregator;
  policy.inner_steps = inner;
  policy.outer_optimizer.lr = outer_lr;
  policy.outer_optimizer.momentum = outer_momentum;
  return train_with(p, data, policy);
}

// ---- eval ----------------------------------------------------------------------------------

// The heads of published weights: the safetensors file does not say (any divisor of the width
// loads), so Hugging Face's config.json beside it does when present, and --n-head must agree.
std::int64_t weights_heads(const fs::path& weights, const options& opt) {
  const auto given = opt.integer("n-head", 0, 0, 1 << 16);
  const auto config = weights.parent_path() / "config.json";
  if (!fs::exists(config)) {
    dt::detail::check(given > 0, "--weights ", weights.string(), " needs --n-head (there is no config.json beside it to say)");
    return given;
  }
  const auto json = dt::io::parse_json(dt::io::read_file(config));
  const bool has = json.members.count("n_head") != 0;
  dt::detail::check(has || json.members.count("num_attention_heads") != 0, config.string(), " names no n_head");
  const auto heads = json.at(has ? "n_head" : "num_attention_heads").as_int();
  dt::detail::check(given == 0 || given == heads, "--n-head ", given, " contradicts ", config.string(), ", which says n_head ", heads);
  return heads;
}

int cmd_eval(const options& opt) {
  set_threads(threads(opt, 0));
  const std::string weights = opt.text("weights", ""), shard = opt.text("tokens", ""), dump = opt.text("dump-grads", "");
  const auto B = opt.integer("batch-size", 4, 1, 1 << 20);
  auto T = opt.integer("block-size", 64, 1, 1 << 24);
  dt::detail::check(!weights.empty() && !shard.empty(), "eval needs --weights and --tokens");
  const auto n_head = weights_heads(weights, opt);
  opt.reject_unknown();
  const auto file = dt::io::load_safetensors(weights);
  const auto cfg = dt::train::gpt2_config(file, n_head);
  dt::detail::check(B > 0 && T > 0 && T <= cfg.block_size, "--batch-size must be positive and --block-size in [1, ",
                    cfg.block_size, "]");
  dt::rng unused(0, "init");
  dt::nn::gpt<> model(cfg, unused);
  dt::train::import_gpt2_weights(model, file);
  const auto tokens = dt::io::read_token_shard(shard);
  const auto need = static_cast<std::size_t>(B * (T + 1));
  dt::detail::check(tokens.size() >= need, shard, " holds ", tokens.size(), " tokens; ", B, " rows of ", T + 1, " need ", need);
  std::vector<std::int32_t> x, y;
  for (std::int64_t b = 0; b < B; ++b) {
    const auto row = tokens.begin() + b * (T + 1);
    x.insert(x.end(), row, row + T);
    y.insert(y.end(), row + 1, row + T + 1);
  }
  for (auto t : x) dt::detail::check(t < cfg.vocab_size, "token ", t, " is outside the model's vocabulary of ", cfg.vocab_size);
  auto loss = model.loss(dt::from_vector(x, {B, T}), dt::from_vector(y, {B, T}));
  std::printf("loss %.9g\n", loss.item());
  if (!dump.empty()) {
    loss.backward();
    dt::io::named_tensors grads;
    for (const auto& e : model.parameters()) grads.emplace(e.name, e.param.grad());
    dt::io::save_safetensors(dump, grads);
    std::printf("gradients written to %s\n", dump.c_str());
  }
  return 0;
}

// ---- sample --------------------------------------------------------------------------------

// --checkpoint names a file, a peer's folder (DIR/peer-R-of-W) or a --checkpoint-dir: then
// peer 0's newest step.
fs::path checkpoint_file(const fs::path& path) {
  if (!fs::is_directory(path)) return path;
  const auto name = path.filename().empty() ? path.parent_path().filename() : path.filename();
  int r = -1, w = -1;
  char tail = 0;
  if (std::sscanf(name.c_str(), "peer-%d-of-%d%c", &r, &w, &tail) == 2 && r >= 0 && r < w) {
    dt::fault::checkpoint_every ck;
    ck.dir = (path.filename().empty() ? path.parent_path() : path).parent_path().string();
    const auto steps = ck.saved_steps(r, w);
    dt::detail::check(!steps.empty(), "--checkpoint ", path.string(), " holds no step-N.ckpt files");
    return ck.file(r, w, steps.back());
  }
  std::vector<int> worlds;
  for (const auto& [fr, fw] : peer_folders(path))
    if (fr == 0) worlds.push_back(fw);
  dt::detail::check(!worlds.empty(), "--checkpoint ", path.string(), " holds no checkpoints (expected ", path.string(),
                    "/peer-0-of-W/step-N.ckpt)");
  dt::detail::check(worlds.size() == 1, "--checkpoint ", path.string(), " holds runs of several sizes; name one, as ",
                    (path / ("peer-0-of-" + std::to_string(worlds.back()))).string());
  dt::fault::checkpoint_every ck;
  ck.dir = path.string();
  const auto steps = ck.saved_steps(0, worlds[0]);
  dt::detail::check(!steps.empty(), "--checkpoint ", ck.peer_dir(0, worlds[0]).string(), " holds no step-N.ckpt files");
  return ck.file(0, worlds[0], steps.back());
}

int cmd_sample(const options& opt) {
  set_threads(threads(opt, 0));
  const std::string ckpt = opt.text("checkpoint", ""), weights = opt.text("weights", "");
  const auto n_head = weights.empty() ? opt.integer("n-head", 0) : weights_heads(weights, opt);
  const std::string prompt = opt.text("prompt", ""), prompt_ids = opt.text("prompt-ids", "");
  const std::string tokenizer_name = opt.text("tokenizer", "");
  dt::detail::check(tokenizer_name.empty() || tokenizer_name == "gpt2" || tokenizer_name == "byte",
                    "sample's --tokenizer must be gpt2 or byte, got '", tokenizer_name,
                    "' (a character tokenizer comes with its checkpoint)");
  dt::nn::sample_options sampling;
  sampling.tokens = opt.integer("tokens", sampling.tokens, 0, 1 << 24);
  sampling.top_k = opt.integer("top-k", sampling.top_k, 0, 1 << 30);
  sampling.temperature = opt.real("temperature", sampling.temperature);
  dt::rng gen(static_cast<std::uint64_t>(opt.integer("seed", static_cast<std::int64_t>(dt::train::trainer_options{}.seed))),
              "sample");
  const bool vocab_given = !opt.text("vocab", "").empty();  // read by text_tokenizer::make below
  opt.reject_unknown();
  dt::detail::check(ckpt.empty() != weights.empty(), "sample needs exactly one of --checkpoint and --weights");
  dt::detail::check(sampling.temperature > 0, "--temperature must be > 0, got ", sampling.temperature);

  std::optional<dt::nn::gpt<>> model;
  std::optional<text_tokenizer> tok;
  if (!tokenizer_name.empty()) tok = text_tokenizer::make(tokenizer_name, opt, {});
  dt::rng unused(0, "init");
  if (!ckpt.empty()) {
    const auto file = checkpoint_file(ckpt);
    const auto c = dt::io::load_checkpoint(file);
    model.emplace(dt::train::config_of(c), unused);
    dt::optim::adamw<> ignored(model->parameters());
    dt::train::restore(c, *model, ignored);
    if (auto own = text_tokenizer::of(c, opt)) {
      dt::detail::check(!tok || tok->name == own->name, "--tokenizer ", tokenizer_name, " contradicts the checkpoint's ",
                        own->name, " tokenizer");
      tok = std::move(own);
    }
    if (file != fs::path(ckpt)) std::fprintf(stderr, "sampling from %s\n", file.c_str());
  } else {
    const auto file = dt::io::load_safetensors(weights);
    model.emplace(dt::train::gpt2_config(file, n_head), unused);
    dt::train::import_gpt2_weights(*model, file);
    // Published GPT-2 weights: GPT-2's vocabulary, where it is found (else ids are printed).
    if (!tok && model->config().vocab_size == 50257) {
      try {
        tok = text_tokenizer::make("gpt2", opt, {});
      } catch (const dt::error&) {
        if (vocab_given) throw;
      }
    }
  }
  const auto& cfg = model->config();
  dt::detail::check(!tok || tok->vocab_size() <= cfg.vocab_size, "the ", tok ? tok->name : "", " tokenizer has ",
                    tok ? tok->vocab_size() : 0, " ids, more than the model's vocabulary of ", cfg.vocab_size);
  std::vector<std::int32_t> ids;
  if (!prompt_ids.empty()) {
    for (const auto& part : split_list(prompt_ids)) {
      std::size_t n = 0;
      long long v = -1;
      try { v = std::stoll(part, &n); } catch (const std::exception&) { n = 0; }
      dt::detail::check(n == part.size() && n > 0, "--prompt-ids expects integers separated by commas; '", part,
                        "' is not one");
      dt::detail::check(v >= 0 && v < cfg.vocab_size, "--prompt-ids: token ", part, " is outside the vocabulary of ",
                        cfg.vocab_size);
      ids.push_back(static_cast<std::int32_t>(v));
    }
  } else if (!prompt.empty()) {
    dt::detail::check(tok.has_value(), "--prompt needs a tokenizer: this model names none; give --tokenizer gpt2|byte or use --prompt-ids");
    ids = tok->encode(prompt);
  }
  if (ids.empty()) ids.push_back(tok && tok->gpt2 ? tok->gpt2->end_of_text_id() : 0);

  const std::size_t first_new = ids.size();
  ids = dt::nn::generate(*model, std::move(ids), sampling, gen);
  // A model may have more ids than its tokenizer (a vocabulary padded to 50304): text only when
  // every sampled id is the tokenizer's.
  const bool decodable = tok && std::all_of(ids.begin(), ids.end(), [&](std::int32_t id) { return id < tok->vocab_size(); });
  if (tok && !decodable) std::fprintf(stderr, "sampled ids beyond the %s tokenizer's %lld: printing ids\n", tok->name.c_str(),
                                      static_cast<long long>(tok->vocab_size()));
  if (decodable) {
    const auto text = tok->decode(ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  } else {
    for (std::size_t i = first_new; i < ids.size(); ++i) std::printf("%s%d", i == first_new ? "" : ",", ids[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "help";
  try {
    if (command == "train") return cmd_train(options(argc, argv, 2, {"resume", "no-bias", "mpi", "elastic", "allow-non-finite", "eager"}));
    if (command == "eval") return cmd_eval(options(argc, argv, 2, {}));
    if (command == "sample") return cmd_sample(options(argc, argv, 2, {}));
    if (command == "prepare") return cmd_prepare(options(argc, argv, 2, {}));
    if (command == "version" || command == "--version") {
      std::printf("decentrain-gpt %s\n", dt::version.string);
      return 0;
    }
    if (command == "help" || command == "--help" || command == "-h") {
      std::fputs(usage().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "unknown command '%s'\n\n%s", command.c_str(), usage().c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decentrain-gpt %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
