// decentrain-gpt: train (on one machine or as decentralized peers), evaluate and sample GPT-2 models.
//
//   decentrain-gpt train  [--preset NAME | --n-layer L --n-head H --n-embd C --block-size T]
//                         [--data PATH] [--steps N] [--batch-size B] [--lr LR] [--seed S]
//                         [--checkpoint-dir DIR] [--resume] [--threads N] [--metrics FILE]
//                         [--peers N | --listen HOST:PORT ... | --mpi] [--comm NAME] ...
//   decentrain-gpt eval   (--checkpoint FILE|DIR | --weights W.safetensors [--n-head H])
//                         (--tokens SHARD | --text FILE) [--batch-size B] [--block-size T]
//                         [--batches N] [--dump-grads G.safetensors]
//   decentrain-gpt prepare --input TEXT --out DIR [--tokenizer gpt2|byte]
//   decentrain-gpt sample (--checkpoint FILE|DIR | --weights W.safetensors [--n-head H])
//                         [--prompt TEXT | --prompt-ids 1,2,3] [--tokens N] [--temperature X]
//                         [--top-k K] [--seed S]
//   decentrain-gpt export (--checkpoint FILE|DIR) --out W.safetensors
//   decentrain-gpt --version
//
// Every mode of `train` is the library's trainer: one process is a world of one peer.
// `decentrain-gpt help` lists every option with its default; options are written --name value or
// --name=value, and may come from a TOML file (--config run.toml) that the command line overrides.
#include "cli/options.hpp"
#include "cli/peer.hpp"
#include "cli/run_status.hpp"
#include "cli/status_server.hpp"
#include "cli/summary.hpp"

#include <decentrain/decentrain.hpp>

#include <glob.h>
#include <unistd.h>

#include <algorithm>
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
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dt = decentrain;
namespace fs = std::filesystem;
using cli::launch;
using cli::metrics_path;
using cli::options;
using cli::print_changes;
using cli::print_link_traffic;
using cli::print_site_traffic;
using cli::print_suspects;
using cli::print_transport;
using cli::run_hooks;
using cli::set_threads;
using cli::train_plan;

namespace {

// SIGINT: every trainer asks cli::interrupted between steps (trainer::stop_when), and the fault
// policy saves each peer's state before fit returns.
extern "C" void on_interrupt(int) { cli::interrupted = true; }

// ---- options -------------------------------------------------------------------------------

// --elastic over TCP: the ranks a group may hold unless --max-world says otherwise.
constexpr int elastic_max_world = 1024;

constexpr std::int64_t max_steps = std::int64_t{1} << 40;

void declare_config(CLI::App& cmd) {
  cli::text(cmd, "config", "FILE",
            "options from a TOML file (name = value, flags = true; keys under [" + cmd.get_name() +
                "] apply to this command only);\nthe command line overrides it");
}

// --threads, as every command takes it.
void declare_threads(CLI::App& cmd, const std::string& when_absent) {
  cli::integer(cmd, "threads", "N", "CPU threads per peer, 0 for all (default: " + when_absent + ")", std::nullopt, 0, 1024);
}

void declare_vocab(CLI::App& cmd) {
  cli::text(cmd, "vocab", "DIR", "GPT-2's encoder.json + vocab.bpe (default: $DECENTRAIN_GPT2_VOCAB, else the installed copy)");
}

void declare_train(CLI::App& cmd) {
  const dt::train::trainer_options t;
  const dt::fault::checkpoint_every ck;
  const dt::transport::tcp_options tcp;
  const dt::fault::elastic elastic;
  declare_config(cmd);

  const std::string model = "Model";
  cli::text(cmd, "preset", "NAME", "tiny | shakespeare-char | gpt2-124m", "tiny")->group(model);
  cli::integer(cmd, "n-layer", "N", "transformer blocks (default: the preset's)", std::nullopt, 1, 4096)->group(model);
  cli::integer(cmd, "n-head", "N", "attention heads (default: the preset's)", std::nullopt, 1, 1 << 16)->group(model);
  cli::integer(cmd, "n-embd", "N", "width (default: the preset's)", std::nullopt, 1, 1 << 20)->group(model);
  cli::integer(cmd, "block-size", "T", "context length (default: the preset's)", std::nullopt, 1, 1 << 24)->group(model);
  cli::real(cmd, "dropout", "P", "dropout (default: the preset's)", std::nullopt, 0, 1)->group(model);
  cli::flag(cmd, "no-bias", "no biases in linears and layer norms (nanoGPT's bias=False)")->group(model);
  cli::integer(cmd, "subspace", "K",
               "confine what the residual stream learns to a fixed K-dimensional subspace\n"
               "(Protocol Models): pipeline and SWARM stages then send K numbers a token\n"
               "instead of n_embd, both ways; the head is untied (default 0: off)",
               std::nullopt, 0, 1 << 20)
      ->group(model);
  cli::text(cmd, "init-from", "W.safetensors",
            "start from GPT-2 weights (fine-tuning): the model's shape is theirs (n_head from\n"
            "config.json beside them, or --n-head); --block-size may crop their context")
      ->group(model);

  const std::string data = "Data";
  cli::text(cmd, "data", "PATH",
            "text (a file or a glob of files), llm.c token shards (a file, a glob\n"
            "such as 'dir/train_*.bin', or a folder made by `prepare`, whose\n"
            "val_*.bin is then the validation split); default: the built-in corpus")
      ->group(data);
  cli::choice(cmd, "tokenizer", "NAME", "for text: char (its distinct bytes; default) | byte | gpt2", {"char", "byte", "gpt2"}, "")
      ->group(data);
  declare_vocab(cmd);
  cmd.get_option("--vocab")->group(data);
  cli::integer(cmd, "vocab-size", "N",
               "vocabulary for token shards (default: prepare.json's, else 50257 with\n"
               "--tokenizer gpt2, else the preset's)",
               std::nullopt, 1, 1 << 30)
      ->group(data);
  cli::text(cmd, "val-data", "PATH", "token shards for validation (a file or a glob)")->group(data);
  cli::real(cmd, "val-fraction", "F", "held-out fraction of the data when there is no --val-data", 0.1, 0, 0.999999)->group(data);

  const std::string training = "Training";
  cli::integer(cmd, "steps", "N", "optimizer steps in all", t.steps, 1, max_steps)->group(training);
  cli::integer(cmd, "batch-size", "B", "sequences per step, per peer", t.batch_size, 1, 1 << 24)->group(training);
  cli::real(cmd, "lr", "LR", "peak learning rate of the cosine schedule", t.lr)->group(training);
  cli::real(cmd, "min-lr", "LR", "cosine floor (default " + (t.min_lr < 0 ? std::string("lr / 10") : cli::show(t.min_lr)) + ")",
            std::nullopt)
      ->group(training);
  cli::integer(cmd, "warmup", "N",
               "warmup steps (default " + (t.warmup_steps < 0 ? std::string("steps / 10") : std::to_string(t.warmup_steps)) + ")",
               std::nullopt, 0, max_steps)
      ->group(training);
  cli::real(cmd, "beta1", "B", "AdamW beta1", t.beta1)->group(training);
  cli::real(cmd, "beta2", "B", "AdamW beta2", t.beta2)->group(training);
  cli::real(cmd, "weight-decay", "W", "AdamW weight decay on matrices", t.weight_decay)->group(training);
  cli::real(cmd, "grad-clip", "X", "global-norm clip, 0 to disable", t.grad_clip)->group(training);
  cli::flag(cmd, "allow-non-finite",
            "train on when the loss becomes NaN or infinite (by default the run\n"
            "stops with an error before that step is saved)")
      ->group(training);
  cli::choice(cmd, "compute-dtype", "T",
              "f32 or bf16: mixed precision, bf16 activations and products\n"
              "with f32 weights, optimizer state and gradients",
              {"f32", "bf16"})
      ->group(training);
  cli::integer(cmd, "eval-every", "N", "steps between evaluations, 0 for only at the end", 250, 0, max_steps)
      ->group(training);
  cli::integer(cmd, "eval-batches", "N", "batches per evaluation", 20, 1, 1 << 20)->group(training);
  cli::integer(cmd, "seed", "S", "seed of every random stream", static_cast<std::int64_t>(t.seed), 0,
               std::numeric_limits<std::int64_t>::max())
      ->group(training);
  declare_threads(cmd, "OMP_NUM_THREADS or all cores for one process alone, 1 in the\ndecentralized modes");
  cmd.get_option("--threads")->group(training);
  cli::text(cmd, "device", "D",
            "cpu | cuda (peer r on GPU r % GPUs; in-process peers share\n"
            "them) | cuda:N (every peer of this process on GPU N); TCP\n"
            "peers of one run may differ",
            "cpu")
      ->group(training);

  const std::string output = "Output";
  cli::text(cmd, "metrics", "FILE",
            "JSON lines: a \"config\" line, then a line per step and per evaluation,\n"
            "each naming its peer (\"rank\"); '' to disable. One file for every peer\n"
            "of a process; over TCP or MPI each process writes its own: \"{rank}\"\n"
            "in FILE becomes the rank, else FILE gets .rank-R before its extension",
            "metrics.jsonl")
      ->group(output);
  cli::integer(cmd, "log-every", "N",
               "a progress line every N steps when the output is not a terminal (on\n"
               "a terminal a bar redraws in place instead); 0: none",
               dt::train::progress::options{}.log_every, 0, max_steps)
      ->group(output);
  cli::flag(cmd, "quiet", "no progress, evaluations or model description: warnings, errors and\nthe summary only")
      ->group(output);
  cli::integer(cmd, "status-port", "P",
               "serve a status page (loss curves, a table of the peers; JSON at /metrics) on\n"
               "this port while training; 0: any free port (the address is printed)",
               std::nullopt, 0, 65535)
      ->group(output);
  cli::text(cmd, "status-host", "ADDRESS", "where --status-port listens (0.0.0.0: every interface)", "127.0.0.1")->group(output);

  const std::string checkpoints = "Checkpoints (every mode; one process alone is peer 0 of 1)";
  cli::text(cmd, "checkpoint-dir", "DIR",
            "each peer saves DIR/peer-R-of-W/step-N.ckpt (default: none; then only\n"
            "Ctrl-C saves, to ./checkpoints)")
      ->group(checkpoints);
  cli::integer(cmd, "save-every", "N", "steps between checkpoints, and one after the last step; 0: only on Ctrl-C", ck.every, 0,
               max_steps)
      ->group(checkpoints);
  cli::integer(cmd, "keep-checkpoints", "N", "newest checkpoints kept per peer", ck.keep_last, 1, 1'000'000)->group(checkpoints);
  cli::flag(cmd, "resume",
            "continue from the newest step in DIR that every peer has (--elastic:\n"
            "each peer from its own newest). Ctrl-C stops every peer at the same\n"
            "step (peers agree every " +
                std::to_string(t.stop_check_every) +
                " steps, stopping at the check after the\n"
                "one that saw it), saves each peer's checkpoint and exits\n"
                "with status 130")
      ->group(checkpoints);

  const std::string peers = "Decentralized training (one of three modes; --batch-size is then per peer)";
  cli::integer(cmd, "peers", "N", "N peers as threads of this process, over simulated links", std::nullopt, 1, 256)->group(peers);
  cli::choice(cmd, "link", "NAME", "--peers: the simulated links", {"lan", "ideal", "wan", "heterogeneous"})->group(peers);
  cli::text(cmd, "speeds", "S,S,...|spread",
            "--peers: how fast each peer computes (2: twice this machine's speed;\none number a peer), or 'spread': 1x to 4x")
      ->group(peers);
  cli::text(cmd, "straggle", "P,F",
            "--peers: a straggler tail: each inner step runs F times as long with\n"
            "probability P (0.02,10: 2% of steps 10x), drawn from --seed")
      ->group(peers);
  cli::text(cmd, "listen", "HOST:PORT", "this process is one TCP peer, listening here...")->group(peers);
  cli::text(cmd, "join", "HOST:PORT,...",
            "...joining through these peers (not for the first); without --listen\n"
            "it accepts no connections (behind a NAT) and dials every peer that\n"
            "listens, reaching the others like it directly where their NATs let a\n"
            "hole be punched, else through a relay")
      ->group(peers);
  cli::integer(cmd, "punch-ms", "MS",
               "over TCP, a peer without --listen: how long it tries to connect directly\n"
               "to another such peer before going through a relay (0: never tries)",
               1000, 0, 60000)
      ->group(peers);
  cli::text(cmd, "streams", "N|auto",
            "over TCP: connections a pair of peers keeps; messages of 4 MiB and\n"
            "more go over all of them at once (fills a long fat link where one\n"
            "stream's send buffer cannot; set it alike on every peer). auto: from\n"
            "one up to 16, doubled while the measured link holds each at its window",
            "1")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            const auto v = cli::parse_integer(s);
            if (s == "auto" || (v && *v >= 1 && *v <= 16)) return {};
            return "must be a number of connections in [1, 16] or auto, got '" + s + "'";
          },
          "", "streams"))
      ->group(peers);
  cli::integer(cmd, "relay-circuits", "N",
               "over TCP, a peer that listens: the pairs of peers that accept no\n"
               "connections it relays at once (0: it relays none)",
               64, 0, 65536)
      ->group(peers);
  cli::real(cmd, "relay-rate", "MBIT", "...and the bandwidth it gives them all together, in Mbit/s (0: no limit)", 0.0, 0, 1e9)
      ->group(peers);
  cli::text(cmd, "advertise", "HOST", "the host others reach this peer at (needed with --listen 0.0.0.0:PORT)")->group(peers);
  cli::integer(cmd, "rank", "R", "...as peer R", 0, 0, 65535)->group(peers);
  cli::integer(cmd, "world", "W", "...of W", 1, 1, 65536)->group(peers);
  cli::flag(cmd, "mpi", "every rank of mpirun is a peer (when built with MPI)")->group(peers);
  cli::real(cmd, "link-in-flight", "MB",
            "over TCP or MPI: the slowest link's bandwidth x latency in MB (100 Mbit/s\n"
            "x 100 ms = 1.25), so all-reduces move enough per step to hide latency;\n"
            "the same on every peer (simulated links size this on their own)",
            0.0, 0, 1e6)
      ->group(peers);
  cli::flag(cmd, "halving-doubling",
            "in a world of 2^k >= 4 peers, all-reduces that would go around the ring go\n"
            "by recursive halving and doubling instead: the same bytes in 2 log2(N)\n"
            "latencies, not 2 (N - 1); faster on links alike, slower where each peer's\n"
            "links differ (bench/RESULTS.md); the same on every peer")
      ->group(peers);

  const std::string net = "TCP peers";
  cli::text(cmd, "key-file", "PATH",
            "the run's secret key (16 to 4096 bytes, readable only by you;\n"
            "make one with: head -c 32 /dev/urandom > run.key). Only peers holding\n"
            "the same key can join, and every frame is authenticated. Also read from\n"
            "the file that DECENTRAIN_KEY_FILE names. Without one, anyone who can\n"
            "reach the port can join the group")
      ->group(net);
  cli::text(cmd, "identity", "PATH",
            "this peer's own private key (Ed25519, PEM, readable only by you), listed\n"
            "for its rank in --roster (make a run's with scripts/identities DIR N).\n"
            "A peer then proves its rank with its own key: no other peer, run key\n"
            "or not, can take its rank or speak for it")
      ->group(net);
  cli::text(cmd, "roster", "PATH", "the run's roster: every rank's public key (with --identity)")->group(net);
  cli::text(cmd, "tls-cert", "PATH",
            "TLS: this peer's certificate (PEM), signed by the run's CA (make a\n"
            "run's CA and certificates with scripts/tls_certs DIR N). With --tls-key\n"
            "and --tls-ca, only peers with a certificate of the run's CA can join,\n"
            "and every frame is encrypted")
      ->group(net);
  cli::text(cmd, "tls-key", "PATH", "TLS: the certificate's private key (PEM, readable only by you)")->group(net);
  cli::text(cmd, "tls-ca", "PATH", "TLS: the run's CA certificate: the only one a peer's may chain to")->group(net);
  cli::flag(cmd, "tls-bind-ranks",
            "TLS: every certificate must name a rank (\"rank N\", as scripts/tls_certs\n"
            "makes them) and admits only that rank")
      ->group(net);
  cli::integer(cmd, "handshake-timeout-ms", "MS", "a connection must say (and prove) who it is within this",
               tcp.handshake_timeout.count(), 1, 86'400'000)
      ->group(net);
  cli::integer(cmd, "join-timeout-ms", "MS", "how long to try to reach the group", 60000, 1, 86'400'000)->group(net);
  cli::integer(cmd, "peer-timeout-ms", "MS", "how long to wait for a live peer's message (one still computing)\nbefore failing",
               tcp.recv_timeout.count(), 1, 86'400'000)
      ->group(net);
  cli::integer(cmd, "heartbeat-ms", "MS",
               "every connection carries a heartbeat this often; 0 turns them\n"
               "off, and a frozen peer is then found only by --peer-timeout-ms",
               tcp.heartbeat_interval.count(), 0, 86'400'000)
      ->group(net);
  cli::integer(cmd, "silence-ms", "MS",
               "a peer heard from nothing for longer than its deadline (from\n"
               "its measured heartbeats, never under this) is taken for frozen or cut\n"
               "off",
               tcp.min_silence.count(), 1, 86'400'000)
      ->group(net);

  const std::string fault = "Elastic groups";
  cli::flag(cmd, "elastic",
            "with --peers or --listen: peers that die, freeze or are cut off are left\n"
            "out and the others train on (fault::elastic); the summary lists the\n"
            "changes; under MPI a dead rank ends the job. Ctrl-C on a TCP peer\n"
            "saves it and leaves the group (the others go on); with --resume a\n"
            "restarted group starts from each peer's newest checkpoint, and those\n"
            "behind take the state of the furthest.\n"
            "Over TCP, a peer started later with --join and a rank of its own\n"
            "(--rank R --world W, R at or above W, or a rank the group left out)\n"
            "enters the running group and takes its state from the members")
      ->group(fault);
  cli::integer(cmd, "max-world", "N", "over TCP: the ranks the group may ever hold, joiners included", elastic_max_world, 1, 65536)
      ->group(fault);
  cli::integer(cmd, "agreement-timeout-ms", "MS",
               "how long a live peer may take to join an agreement on the\n"
               "group; over TCP more than --silence-ms, since a peer may first wait\n"
               "that long on a frozen one",
               elastic.agreement.timeout.count(), 1, 86'400'000)
      ->group(fault);
  cli::choice(cmd, "left-out", "WHAT",
              "over TCP, a peer the others went on without (it was frozen, or\n"
              "cut off on the smaller side of a partition): stop with an error,\n"
              "or rejoin: wait for the group, be taken in again and take its\n"
              "state (what it trained alone is dropped)",
              {"stop", "rejoin"})
      ->group(fault);
  cli::integer(cmd, "rejoin-timeout-ms", "MS", "--left-out rejoin: how long it waits to be taken in again",
               elastic.rejoin_timeout.count(), 1, 86'400'000)
      ->group(fault);
  cli::text(cmd, "kill", "R@S,...", "with --peers: kill peer R once it has done S steps (a demo\nand a test of the elastic group)")
      ->group(fault);
  cli::text(cmd, "exclude-after", "T/N",
            "the others exclude a peer whose contributions the aggregation left\n"
            "out (NaN, infinities) or found far off in T of its last N calls\n"
            "(N at most 64); 0: only report them (default " +
                std::to_string(elastic.exclusion.times) + "/" + std::to_string(elastic.exclusion.of_last) + ")")
      ->group(fault);

  const std::string comm = "Communication";
  cli::choice(cmd, "comm", "NAME",
              "sync | local-sgd | diloco | streaming-diloco | gossip | push-sum |\n"
              "ad-psgd | moshpit | choco (default diloco; sync for one process alone).\n"
              "gossip: each peer averages with the neighbours --topology names\n"
              "(D-PSGD, no all-reduce); push-sum: the same graphs, values and weights\n"
              "pushed (SGP; --overlap 1: OSGP); ad-psgd: each step a peer asks one\n"
              "neighbour to average and never waits (AD-PSGD; peers wait for the\n"
              "slowest only at checkpoints, evaluations and the end, each wait within\n"
              "--peer-timeout-ms; not with --elastic); moshpit:\n"
              "local SGD averaged in groups of --moshpit-group along one axis of a\n"
              "grid a round; choco: gossip on a ring or torus through --codec\n"
              "(default sign), CHOCO-SGD",
              {"sync", "local-sgd", "diloco", "streaming-diloco", "gossip", "push-sum", "ad-psgd", "moshpit", "choco"}, "")
      ->group(comm);
  cli::choice(cmd, "topology", "NAME",
              "the graph of gossip, push-sum, ad-psgd and choco: one-peer-exponential\n"
              "(one peer a round, 2^k ahead; default) | exponential (every 2^k ahead,\n"
              "every round; ad-psgd's default) | ring (choco's default) | torus |\n"
              "random (a new random pairing each round); choco takes ring or torus,\n"
              "ad-psgd a graph that does not change (exponential, ring, torus)",
              {"one-peer-exponential", "exponential", "ring", "torus", "random"})
      ->group(comm);
  cli::integer(cmd, "inner-steps", "H",
               "steps between averages for local-sgd and diloco, between two exchanges\n"
               "of the same fragment for streaming-diloco, between the rounds of gossip,\n"
               "push-sum, choco and moshpit, between ad-psgd's requests (default 50; 1\n"
               "for gossip, push-sum, ad-psgd, choco)",
               50, 1, max_steps)
      ->group(comm);
  cli::integer(cmd, "fragments", "P",
               "streaming-diloco: the model's layers dealt into P fragments (strided),\n"
               "each exchanged every H steps, H/P steps after the previous",
               4, 1, 4096)
      ->group(comm);
  cli::integer(cmd, "overlap", "TAU",
               "streaming-diloco and diloco: an exchange runs beside the next TAU inner\n"
               "steps before it is merged (default 1 for streaming-diloco, 0 for diloco);\n"
               "push-sum: 1 takes each round's messages a round late (OSGP), 0 not",
               std::nullopt, 0, max_steps)
      ->group(comm);
  cli::real(cmd, "mix", "ALPHA",
            "with --overlap: at a merge a peer keeps ALPHA of its own parameters and\n"
            "takes 1 - ALPHA of the new global ones",
            0.5, 0, 1)
      ->group(comm);
  cli::integer(cmd, "target-batch", "ROWS",
               "sync: rows a step for the whole group (hivemind's target batch): each\n"
               "peer adds up micro-batches of --batch-size rows, as many as its measured\n"
               "speed makes its share, and weighs by its rows; for peers of different\n"
               "speeds (--speeds, or different machines). Default: off",
               std::nullopt, 1, std::int64_t{1} << 40)
      ->group(comm);
  cli::flag(cmd, "sized-to-speed",
            "diloco: work sized to speed (DyLU): from the second step on, each peer\n"
            "takes as many inner steps as it computes while the slowest takes H, and\n"
            "its pseudo-gradient weighs by its rows (with --speeds, or peers of\n"
            "different machines).\n"
            "streaming-diloco (or diloco with --overlap): each peer takes as many inner\n"
            "steps a step as it computes while the slowest takes one, by speeds agreed\n"
            "after step 0 and then beside each round; each fragment's average weighs\n"
            "by rows")
      ->group(comm);
  cli::flag(cmd, "deadline",
            "diloco with --sized-to-speed: each round closes once half the peers are\n"
            "in and the median + 2 MAD of recent arrival offsets has passed after the\n"
            "first (at least 10% of the round's compute); later peers take the group's\n"
            "average, drop their round and skip the steps the group took")
      ->group(comm);
  cli::flag(cmd, "auto",
            "diloco: pick H and the codec from measures (the links probed at the\n"
            "start and timed at each exchange, the slowest peer's compute), the same on\n"
            "every peer, and pick again when a measure drifts by 30%: the least lossy\n"
            "of identity, int8 and int4 (only --codec's, if given) whose rounds of at\n"
            "most 100 inner steps keep the peers computing 97% of the time, and the\n"
            "fewest such steps (10 to 1000, at most --steps / 4; --inner-steps until\n"
            "the first pick, after step 0). Sizes work to speed as --sized-to-speed\n"
            "does; every pick is printed and in the metrics.\n"
            "streaming-diloco: pick H, the fragments (1, 2 or 4), the overlap and the\n"
            "codec that hide each fragment's exchange behind the overlap's inner steps,\n"
            "once the links probed beside the first steps are in (nothing is sent\n"
            "before) and again when the rounds' measures (each exchange timed) are off\n"
            "by 30%; with --sized-to-speed, work sized to speed as well")
      ->group(comm);
  cli::flag(cmd, "eager",
            "streaming-diloco and diloco: eager updates, an exchange overlaps a whole\n"
            "round and the peer steps at once with its own pseudo-gradient standing in\n"
            "for its share of the average (instead of --overlap and --mix)")
      ->group(comm);
  cli::real(cmd, "consensus-step", "GAMMA",
            "choco: how far a peer moves towards its neighbours' public copies a\n"
            "round, in (0, 1]; 0: a third of the codec's measured fidelity (default)",
            0, 0, 1)
      ->group(comm);
  cli::choice(cmd, "outer-averaging", "HOW",
              "diloco: how the pseudo-gradients are averaged: all-reduce (one among\n"
              "all peers; the default without --site) | moshpit (rounds in groups\n"
              "of --moshpit-group along the axes of a grid: no collective spans\n"
              "every peer) | sites (the two-level all-reduce over --site's sites;\n"
              "the default with --site)",
              {"all-reduce", "moshpit", "sites"})
      ->group(comm);
  cli::text(cmd, "site", "NAME|NAME,...",
            "sync, diloco: average the gradients or pseudo-gradients over sites\n"
            "(datacenters, machines): summed inside each site, 1/k of them\n"
            "across per member, the result shared inside (two-level all-reduce).\n"
            "Over TCP or MPI:\n"
            "this peer's site; with --peers N: N names, one a peer, whose links\n"
            "inside a site are lan's and --link's between sites; or auto (every\n"
            "peer): the sites found from measured round trips. The summary\n"
            "gives the bytes per link")
      ->group(comm);
  cli::choice(cmd, "ring-order", "HOW",
              "sync, diloco: the ring of the all-reduce: rank (rank order, the\n"
              "default) | latency (laid along the pairs of least round trip, measured\n"
              "at the first exchange, after each new view and, with --auto, after the\n"
              "links drift; --auto's default) |\n"
              "bandwidth (round trips and a 64 KB transfer a pair). The summary gives\n"
              "the order. Buffers that take recursive doubling keep rank order",
              {"rank", "latency", "bandwidth"})
      ->group(comm);
  cli::flag(cmd, "sync-inside-site",
            "--site: also average the gradients inside each site at every step, so\n"
            "that a site trains as one replica and only DiLoCo's outer average\n"
            "crosses between sites (INTELLECT-1's shape)")
      ->group(comm);
  cli::integer(cmd, "moshpit-group", "M",
               "moshpit and --outer-averaging moshpit: the grid's side; M^d peers\n"
               "reach the exact mean in d rounds (default 4)",
               4, 2, 1 << 20)
      ->group(comm);
  cli::text(cmd, "codec", "SPEC",
            "how payloads go on the wire: fp16 | bf16 |\n"
            "int8[:block=N,stochastic,seed=S] | int4[:...] | fp4[:block=N] |\n"
            "sign[:block=N] | topk:FRACTION | topk:count=K (values f32, or \",int4\"\n"
            "or \",int2\"; \",chunk=N\": the top values of each N), each with \",ef\"\n"
            "for error feedback (\",ef=D\": what waits decays by D a round) and\n"
            "\",adaptive\" to send f32 where that measures faster; dct:FRACTION with\n"
            "chunk=N and top-k's settings (DeMo's DCT top-k); powersgd:rank=R\n"
            "with noef, seed=S, factors=int8|int4|bf16|fp16|fp4 (for example\n"
            "--codec int4:block=64, --codec topk:0.03,chunk=4096,int2,ef=0.95, --codec\n"
            "int8:adaptive, --codec powersgd:rank=4,factors=int8)",
            "identity")
      ->group(comm);
  cli::real(cmd, "significance", "T",
            "diloco: Gaia's filter before the codec: a pseudo-gradient value goes out\n"
            "only once its accumulated size passes T x |its parameter| (T falls with\n"
            "the learning rate); the rest waits in the codec's error feedback. Needs\n"
            "a sparse codec with ef (topk or dct), for example 0.01",
            std::nullopt, 0, 1e9)
      ->group(comm);
  cli::text(cmd, "aggregator", "SPEC",
            "how the peers' contributions combine: mean | sender-mean (per value,\n"
            "the mean of the peers that sent it: for top-k, SparseLoCo's) | median |\n"
            "trimmed-mean[:trim=F] | centered-clip[:iterations=N,radius=R], each\n"
            "with \",bucket=S\" (average random groups of S first) and\n"
            "\",partitioned\" (each peer aggregates a slice: a ring's traffic, not\n"
            "N times it); against peers that send poison, for example --aggregator\n"
            "centered-clip or --aggregator trimmed-mean:trim=0.25,partitioned.\n"
            "Contributions holding NaN or infinities are always left out, and the\n"
            "summary names the peers whose contributions were left out or far off",
            "mean")
      ->group(comm);
  cli::real(cmd, "outer-lr", "X", "DiLoCo's outer Nesterov learning rate", 0.7)->group(comm);
  cli::real(cmd, "outer-momentum", "X", "DiLoCo's outer momentum", 0.9)->group(comm);

  const std::string pipe = "Pipeline and SWARM parallelism (the model cut into stages across peers)";
  cli::choice(cmd, "parallel", "NAME",
              "data: every peer holds the whole model; pipeline: the model's blocks\n"
              "cut into --stages, a peer per stage, and peers / stages copies of that\n"
              "pipeline (rank R holds stage R % S of copy R / S); --comm averages each\n"
              "stage among its copies. swarm: the same cut, each stage held by a pool\n"
              "of peers (rank R starts at stage R % S), every micro-batch sent to the\n"
              "next stage's peer its router expects to be done first (faster peers\n"
              "take more); --comm averages each pool weighted by the rows each peer\n"
              "processed; with --elastic a lost peer's step is redone by the pools\n"
              "left, each keeping its stage",
              {"data", "pipeline", "swarm"})
      ->group(pipe);
  cli::integer(cmd, "stages", "S", "the model's blocks cut into S stages (at most --n-layer)", 2, 1, 4096)->group(pipe);
  cli::integer(cmd, "micro-batches", "M",
               "each step's rows (--batch-size, per copy of the pipeline; swarm: per\n"
               "peers / S) cut into M micro-batches that follow each other through\n"
               "the stages (default S)",
               std::nullopt, 1, 1 << 20)
      ->group(pipe);
  cli::text(cmd, "schedule", "NAME",
            "the order of each stage's forwards and backwards: gpipe | 1f1b (as\n"
            "gpipe's bubble, fewer activations held) | zb-h1 (zero bubble: the\n"
            "backward split in two) | zb-v (zb-h1's split, two chunks a peer in a V:\n"
            "stages x 2 of them) | interleaved[:v=N] (each peer holds N chunks of\n"
            "the model, stages x N of them; a bubble N times smaller; default N 2;\n"
            "--micro-batches a multiple of --stages)",
            "1f1b")
      ->group(pipe);
  cli::integer(cmd, "replicas", "R", "copies of the pipeline: the peers must be S x R (default peers / S)", std::nullopt, 1, 65536)
      ->group(pipe);
  cli::text(cmd, "activation-codec", "SPEC",
            "how activations and their gradients go between stages (a --codec\n"
            "SPEC: bf16, int8, ...)",
            "identity")
      ->group(pipe);
  cli::integer(cmd, "rebalance-every", "N",
               "--parallel swarm --elastic: every N steps the peers share their measured\n"
               "speeds and move a peer to the slowest stage where that makes the\n"
               "pipeline faster (confirmed over 3 checks; the mover takes its new\n"
               "stage's state from a peer there); 0: never",
               0, 0, 1 << 20)
      ->group(pipe);
}

void declare_prepare(CLI::App& cmd) {
  declare_config(cmd);
  cli::text(cmd, "input", "PATH", "a text file or a glob of them, each one document (led by <|endoftext|>)")->required();
  cli::text(cmd, "out", "DIR", "the folder for train_NNNNNN.bin, val_000000.bin and prepare.json")->required();
  cli::choice(cmd, "tokenizer", "NAME", "gpt2 | byte (a char vocabulary comes from the text itself: train on\nthe text with --data)",
              {"gpt2", "byte"});
  declare_vocab(cmd);
  cli::real(cmd, "val-fraction", "F", "the last F of the tokens go to DIR/val_000000.bin", 0.1, 0, 0.999999);
  cli::integer(cmd, "shard-tokens", "N", "tokens per DIR/train_NNNNNN.bin", 100'000'000, 1, 0x7fffffff);
}

// --checkpoint or --weights, as eval, sample and export take a model.
void declare_model_source(CLI::App& cmd) {
  cli::text(cmd, "checkpoint", "FILE|DIR", "a checkpoint file, or a --checkpoint-dir (its newest step of peer 0)");
  cli::text(cmd, "weights", "W.safetensors", "GPT-2 weights (Hugging Face's names)");
  cli::integer(cmd, "n-head", "H", "with --weights: their heads (default: config.json's beside them)", std::nullopt, 1, 1 << 16);
}

void declare_eval(CLI::App& cmd) {
  declare_config(cmd);
  declare_model_source(cmd);
  cli::text(cmd, "tokens", "SHARD", "an llm.c token shard");
  cli::text(cmd, "text", "FILE", "text, encoded with the model's tokenizer");
  cli::choice(cmd, "tokenizer", "NAME", "gpt2 | byte, for --text with a model that names none", {"gpt2", "byte"}, "");
  declare_vocab(cmd);
  cli::integer(cmd, "batch-size", "B", "rows per batch", 4, 1, 1 << 20);
  cli::integer(cmd, "block-size", "T", "tokens per row (default 64, or the model's context when shorter)", std::nullopt, 1, 1 << 24);
  cli::integer(cmd, "batches", "N", "consecutive batches the loss is the mean of", 1, 1, 1 << 20);
  cli::text(cmd, "dump-grads", "FILE", "also write d loss / d weights under the weights' names (one batch)");
  declare_threads(cmd, "OMP_NUM_THREADS or all cores");
}

void declare_export(CLI::App& cmd) {
  declare_config(cmd);
  declare_model_source(cmd);
  cli::text(cmd, "out", "W.safetensors", "where the weights go; config.json is written beside them")->required();
  cli::flag(cmd, "force", "replace a config.json already in --out's folder");
  declare_vocab(cmd);
}

void declare_sample(CLI::App& cmd) {
  const dt::nn::sample_options s;
  declare_config(cmd);
  declare_model_source(cmd);
  cli::text(cmd, "prompt", "TEXT", "encoded with the checkpoint's tokenizer (GPT-2's for 50257-id weights)");
  cli::choice(cmd, "tokenizer", "NAME", "gpt2 | byte, for a model that names none (a character tokenizer\ncomes with its checkpoint)",
              {"gpt2", "byte"}, "");
  declare_vocab(cmd);
  cli::text(cmd, "prompt-ids", "I,J,...", "token ids (any model)");
  cli::integer(cmd, "tokens", "N", "tokens to generate", s.tokens, 0, 1 << 24);
  cli::real(cmd, "temperature", "X", "softmax temperature", s.temperature, 1e-6, 1e6);
  cli::integer(cmd, "top-k", "K", "sample from the K likeliest tokens; 0: all", s.top_k, 0, 1 << 30);
  cli::integer(cmd, "seed", "S", "seed of the sampling", static_cast<std::int64_t>(dt::train::trainer_options{}.seed), 0,
               std::numeric_limits<std::int64_t>::max());
  declare_threads(cmd, "OMP_NUM_THREADS or all cores");
}

// The program's commands, each with its declared options.
struct program {
  CLI::App app{"decentrain-gpt: train, evaluate and sample GPT-2 models, on one machine or as decentralized peers.\n"
               "Every mode of `train` is the library's trainer: one process is a world of one peer.",
               "decentrain-gpt"};
  CLI::App* train;
  CLI::App* prepare;
  CLI::App* eval;
  CLI::App* sample;
  CLI::App* export_;

  program() {
    app.formatter(std::make_shared<cli::formatter>());
    app.footer("decentrain-gpt version   prints the version (also --version)\n"
               "decentrain-gpt COMMAND --help   one command's options");
    const auto command = [&](const char* name, const char* what) {
      auto* c = app.add_subcommand(name, what);
      c->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
      c->allow_extras();  // told apart by cli::parse, which names the unknown option
      return c;
    };
    train = command("train", "train a model, alone or as one of decentralized peers");
    prepare = command("prepare", "text to llm.c token shards (GPT-2's tokenizer by default)");
    eval = command("eval",
                   "the loss of a checkpoint or of GPT-2 weights on a token shard or on text:\n"
                   "reads the first --batches x B x (T+1) tokens as batches of B rows (T\n"
                   "inputs, the next T tokens as targets) and prints `loss <x>`, their mean");
    sample = command("sample", "text from a checkpoint or from GPT-2 weights");
    export_ = command("export", "a checkpoint as GPT-2 weights: safetensors and config.json");
    declare_train(*train);
    declare_prepare(*prepare);
    declare_eval(*eval);
    declare_sample(*sample);
    declare_export(*export_);
  }
};

// --threads N, or (0) what OpenMP would use: OMP_NUM_THREADS or all cores.
int threads(const options& opt, int fallback) {
  const auto n = opt.has("threads") ? opt.integer("threads") : fallback;
#if defined(_OPENMP)
  return n > 0 ? static_cast<int>(n) : omp_get_max_threads();
#else
  return n > 0 ? static_cast<int>(n) : 1;
#endif
}

// "a,b,c" as its items; none for an empty value; an empty item ("1,,2", a trailing comma) is a
// typo, refused naming the flag.
std::vector<std::string> split_list(const std::string& s, const char* flag) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  dt::detail::check(s.front() != ',', "--", flag, " '", s, "': an empty item before the first comma");
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    dt::detail::check(!item.empty(), "--", flag, " '", s, "': an empty item between commas");
    out.push_back(item);
  }
  dt::detail::check(s.back() != ',', "--", flag, " '", s, "': an empty item after the last comma");
  return out;
}

// --exclude-after: "T/N" (T of the last N aggregations), or "0" (never exclude, only report).
dt::fault::elastic::exclusion_rule exclusion_rule(const std::string& s) {
  if (s == "0") return {0, dt::fault::elastic{}.exclusion.of_last};
  const auto slash = s.find('/');
  const auto number = [](std::string_view d) {  // at most 2 digits: N is at most 64
    return !d.empty() && d.size() <= 2 && d.find_first_not_of("0123456789") == std::string_view::npos;
  };
  dt::detail::check(slash != std::string::npos && number(std::string_view(s).substr(0, slash)) &&
                        number(std::string_view(s).substr(slash + 1)),
                    "--exclude-after takes T/N (T of the last N aggregations, for example 3/5) or 0, got '", s, "'");
  const int times = std::stoi(s.substr(0, slash)), of_last = std::stoi(s.substr(slash + 1));
  dt::detail::check(times >= 1 && times <= of_last && of_last <= 64, "--exclude-after ", s,
                    ": T/N needs 1 <= T <= N <= 64 (0 alone: never exclude)");
  return {times, of_last};
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
// one; `elastic`: of any sizes, as joiners' folders are) that reads back whole, loaded, this
// peer's own where it has one: every peer's checkpoints hold the same model shape and tokenizer,
// so a machine that holds only its own peer's folder can resume. A damaged file is passed over,
// saying so (the trainer's resume passes it over too, on every peer alike).
std::pair<fs::path, dt::io::checkpoint> newest_checkpoint(const dt::fault::checkpoint_every& ck, int rank, int world, bool elastic) {
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
  std::vector<std::tuple<bool, std::int64_t, int, int>> candidates;  // (another peer's, step, rank, world)
  for (const auto& [r, w] : folders)
    if (worlds.count(w))
      for (auto step : ck.saved_steps(r, w)) candidates.emplace_back(r != rank, step, r, w);
  dt::detail::check(!candidates.empty(), "--resume: the peer folders in ", ck.dir, " hold no step-N.ckpt files");
  // This peer's own files first, newest first.
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? !std::get<0>(a) : std::get<1>(a) > std::get<1>(b);
  });
  std::string failures;
  for (const auto& [other, step, r, w] : candidates) {
    const auto file = ck.file(r, w, step);
    try {
      auto c = dt::io::load_checkpoint(file);
      if (!failures.empty()) std::printf("--resume: passed over%s\n", failures.c_str());
      return {file, std::move(c)};
    } catch (const dt::error& e) {
      failures += dt::detail::concat("\n  ", file.string(), ": ", e.what());
    }
  }
  dt::detail::fail("--resume: no checkpoint in ", ck.dir, " reads back whole:", failures);
}

// ---- tokenizers and data files ---------------------------------------------------------------

// GPT-2's vocabulary folder: --vocab DIR, else $DECENTRAIN_GPT2_VOCAB, else share/decentrain/gpt2
// beside this program's installed bin/, else the one it was installed with, else the source tree's.
fs::path gpt2_vocab_dir(const options& opt) {
  if (opt.has("vocab")) return opt.text("vocab");
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
  const std::string input = opt.text("input"), out = opt.text("out"), name = opt.text("tokenizer");
  const double val_fraction = opt.real("val-fraction");
  const auto shard_tokens = opt.integer("shard-tokens");
  const auto tok = text_tokenizer::make(name, opt, {});
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
  dt::io::make_folder(out);
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
  const double val_fraction = opt.real("val-fraction");
  std::string path = opt.text("data");
  std::string val_path = opt.text("val-data");
  const std::string tokenizer_name = opt.text("tokenizer");
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
    const auto vocab = opt.has("vocab-size") ? opt.integer("vocab-size")
                       : prepared             ? prepared->at("vocab_size").as_int()
                       : name == "gpt2"       ? 50257
                                              : preset_vocab;
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
  return opt.text("compute-dtype") == "bf16" ? dt::dtype::bf16 : dt::dtype::f32;
}

// The model shape from --preset and its overrides (the vocabulary comes from the data).
dt::nn::gpt_config model_config(const options& opt) {
  auto cfg = dt::nn::gpt_preset(opt.text("preset"));
  if (opt.has("n-layer")) cfg.n_layer = opt.integer("n-layer");
  if (opt.has("n-head")) cfg.n_head = opt.integer("n-head");
  if (opt.has("n-embd")) cfg.n_embd = opt.integer("n-embd");
  if (opt.has("block-size")) cfg.block_size = opt.integer("block-size");
  if (opt.has("dropout")) cfg.dropout = opt.real("dropout");
  cfg.bias = !opt.flag("no-bias");
  if (opt.has("subspace")) cfg.subspace = opt.integer("subspace");
  dt::detail::check(cfg.subspace < cfg.n_embd, "--subspace ", cfg.subspace, " must be less than the width, --n-embd ", cfg.n_embd);
  return cfg;
}

// A resumed run takes the model's shape from its checkpoint: a shape or a policy given on the
// command line that contradicts it is refused, naming both, rather than silently ignored.
void check_resume_agrees(const dt::io::checkpoint& c, const fs::path& file, const options& opt, const dt::nn::gpt_config& given,
                         const std::string& comm) {
  const auto saved = dt::train::config_of<dt::nn::gpt_config>(c);
  const auto agree = [&](const char* option, std::int64_t want, std::int64_t have, const char* field) {
    if (!opt.has(option) && !opt.has("preset")) return;
    const auto from = opt.has(option) ? "--" + std::string(option) + " " + std::to_string(want)
                                      : "--preset " + opt.text("preset") + " (" + field + " " + std::to_string(want) + ")";
    dt::detail::check(want == have, "--resume: ", from, " contradicts ", file.string(), ", which has ", field, " ", have,
                      " (leave the option out to train on with the checkpoint's)");
  };
  agree("n-layer", given.n_layer, saved.n_layer, "n_layer");
  agree("n-head", given.n_head, saved.n_head, "n_head");
  agree("n-embd", given.n_embd, saved.n_embd, "n_embd");
  agree("block-size", given.block_size, saved.block_size, "block_size");
  agree("subspace", given.subspace, saved.subspace, "subspace");
  dt::detail::check(!opt.flag("no-bias") || !saved.bias, "--resume: --no-bias contradicts ", file.string(),
                    ", whose model has biases");
  if (const auto it = c.text.find("run.comm"); it != c.text.end())
    dt::detail::check(it->second == comm, "--resume: --comm ", comm, opt.has("comm") ? "" : " (the default here)",
                      " contradicts ", file.string(), ", which was trained with --comm ", it->second);
}

// The trainer's settings; every default not named here is trainer_options{}'s.
dt::train::trainer_options trainer_settings(const options& opt) {
  dt::train::trainer_options t;
  t.steps = opt.integer("steps");
  t.batch_size = opt.integer("batch-size");
  t.lr = opt.real("lr");
  if (opt.has("min-lr")) t.min_lr = opt.real("min-lr");
  if (opt.has("warmup")) t.warmup_steps = opt.integer("warmup");
  t.beta1 = opt.real("beta1");
  t.beta2 = opt.real("beta2");
  t.weight_decay = opt.real("weight-decay");
  t.grad_clip = opt.real("grad-clip");
  t.stop_on_non_finite = !opt.flag("allow-non-finite");
  t.seed = static_cast<std::uint64_t>(opt.integer("seed"));
  t.eval_every = opt.integer("eval-every");
  t.eval_batches = opt.integer("eval-batches");
  t.compute_dtype = compute_dtype(opt);
  t.collectives.link_bytes_in_flight = opt.real("link-in-flight") * 1e6;
  t.collectives.halving_doubling = opt.flag("halving-doubling");
  t.validate();
  return t;
}

// The one training loop of every mode: the library's trainer, one per peer of this process
// (cli/peer.hpp), with the same hooks everywhere; this part makes the peers' endpoints (TCP
// lives in host code only) and reports.
template <class Fault, class Comm>
int train(const train_plan& p, const dt::data::token_dataset& dataset, Comm comm, Fault fault) {
  constexpr bool elastic = std::is_same_v<Fault, dt::fault::elastic>;
  run_hooks hooks(p);
  const cli::peer_job<Comm, Fault> job{p, hooks, dataset, comm, fault};
  auto run = [&](dt::transport::any_endpoint ep) {
#if DECENTRAIN_CLI_CUDA
    if (p.device.cuda) return cli::run_peer<dt::cuda>(job, std::move(ep));
#endif
    return cli::run_peer<dt::cpu>(job, std::move(ep));
  };
  std::optional<dt::transport::in_process> network;  // --peers
  std::optional<dt::transport::tcp> tcp_peer;  // --listen: its counters end the summary
  // --status-port: the page lives as long as the training (the server goes before the status).
  std::optional<cli::status_server> server;
  if (p.status_port >= 0) {
    auto config = p.run;
    config.add("comm", Comm::name).add("world", world_size_of(p));
    hooks.status.emplace(config.str(), p.trainer.steps);
    server.emplace(p.status_host, p.status_port, [&hooks] { return hooks.status->json(); });
    std::printf("status page: http://%s:%d/\n", p.status_host.c_str(), server->port());
    std::fflush(stdout);
  }

  std::vector<dt::train::fit_result> results;
  int world = p.world, rank = 0;
  int asker = 0;  // whose stopped_at says where a stop happened: this process's peer, or the first survivor
  const auto t0 = std::chrono::steady_clock::now();
  if (p.mode == launch::single || p.mode == launch::in_process) {
    hooks.open_metrics(p.metrics, p);  // one file, one log, for every peer
    auto links = p.mode == launch::single ? dt::transport::links::ideal(1)
                                          : dt::transport::links::preset(p.link, world, p.trainer.seed);
    if (!p.sites.empty() && p.sites.size() > 1) {  // --site: lan inside a site
      const auto map = dt::collective::site_map::from_names(p.sites);
      std::vector<int> site_of;
      for (int r = 0; r < world; ++r) site_of.push_back(map.site_of(r));
      links = dt::transport::links::by_site(links, dt::transport::links::lan(world), site_of);
    }
    dt::transport::in_process::options o;
    o.seed = p.trainer.seed;
    o.recv_timeout = std::chrono::minutes(10);
    o.peers_fail_alone = elastic;
    o.speeds = p.speeds;
    o.straggle = p.straggle;
    network.emplace(std::move(links), o);
    hooks.network = &*network;
    hooks.size_for(world);
    results.resize(static_cast<std::size_t>(network->capacity()));
    std::signal(SIGINT, on_interrupt);
    network->run([&](dt::transport::in_process::endpoint& ep) {
      set_threads(p.threads);
      const auto r = static_cast<std::size_t>(ep.rank());
      results[r] = run(ep);
    });
  } else {
#if DECENTRAIN_HAS_MPI
    std::optional<dt::transport::mpi_environment> mpi_env;  // outlives the endpoint and the trainer
#endif
    std::optional<dt::transport::any_endpoint> ep;
    if (p.mode == launch::tcp) {
      if (!p.quiet)
        std::printf("tcp peer %d of %d %s%s%s%s%s\n", p.tcp.rank, p.tcp.world,
                    p.tcp.listen.empty() ? "accepting no connections (it dials every peer)" : "listening on ", p.tcp.listen.c_str(),
                    p.tcp.key.empty() ? "" : " (run key: peers and frames authenticated)",
                    p.tcp.identity.enabled() ? " (identities: each peer proves its rank with its own key)" : "",
                    p.tcp.tls.enabled() ? " (TLS: peers certified by the run's CA, frames encrypted)" : "");
      std::fflush(stdout);
      if (p.tcp.key.empty() && !p.tcp.tls.enabled() && !p.tcp.identity.enabled())
        std::fprintf(stderr,
                     "warning: no run key (--key-file or %s), no identities (--identity, --roster) and no TLS (--tls-cert, "
                     "--tls-key, --tls-ca): anyone who can reach %s can join this group and "
                     "send it anything a peer may send\n",
                     dt::transport::auth::key_file_variable, p.tcp.listen.empty() ? "its peers" : p.tcp.listen.c_str());
      tcp_peer.emplace(dt::transport::tcp::join(p.tcp));
      if (!p.quiet)
        for (const auto& [other, relay] : tcp_peer->relayed())
          std::printf("tcp peer %d reaches peer %d through the relay peer %d (peer %d accepts no connections)\n", p.tcp.rank, other, relay,
                      other);
      if (!p.quiet)
        for (const int other : tcp_peer->punched())
          std::printf("tcp peer %d reaches peer %d directly: a hole punched through their NATs (neither accepts connections)\n",
                      p.tcp.rank, other);
      ep.emplace(*tcp_peer);
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
    // Each page links the others' (the peers that start together swap addresses; a joiner's
    // page links none).
    if (!ep->joined_late()) {
      std::string page;
      if (server) {
        // A page on every interface is reached at the address the peer is reached at.
        std::string host = p.status_host;
        if ((host == "0.0.0.0" || host == "::") && p.mode == launch::tcp && !p.tcp.listen.empty())
          host = !p.tcp.advertise.empty() ? p.tcp.advertise : p.tcp.listen.substr(0, p.tcp.listen.rfind(':'));
        if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";  // IPv6
        page = "http://" + host + ":" + std::to_string(server->port()) + "/";
      }
      // The links are a convenience: a peer lost before training starts (which an elastic group
      // goes on without) costs them, not the run.
      try {
        const auto pages = cli::swap_status_pages(*ep, page);
        if (hooks.status) hooks.status->set_group(pages);
      } catch (const dt::transport::peer_error& e) {
        std::fprintf(stderr, "warning: the status pages could not swap addresses (%s); this page links no other\n", e.what());
      }
    }
    hooks.open_metrics(metrics_path(p.metrics, rank, world), p);  // a file per process
    set_threads(p.threads);
    hooks.size_for(world);
    std::signal(SIGINT, on_interrupt);
    results.push_back(run(*ep));
    if constexpr (elastic) world = hooks.final_world;  // the group it ended in
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
      print_changes(hooks.changes[static_cast<std::size_t>(first)], hooks.change_counts[static_cast<std::size_t>(first)]);
      results = kept;
      world = static_cast<int>(kept.size());
      asker = first;
    } else {
      print_changes(hooks.changes[static_cast<std::size_t>(p.tcp.rank)], hooks.change_counts[static_cast<std::size_t>(p.tcp.rank)]);
    }
  }
  if (results[0].stopped) {
    if (tcp_peer) print_transport(*tcp_peer);
    const auto step = hooks.stopped_at[static_cast<std::size_t>(asker)];
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
  // Every process reports what it knows: over TCP or MPI its own peer's figures, named by its
  // world rank (each prints its own validation loss).
  {
    // A pipeline whose group re-formed (--elastic) ends in another shape: the summary gives that one.
    auto ended = p;
    std::int64_t longest = 0;
    for (const auto& f : hooks.stage_runs)
      if (f.stages > 0 && f.steps > longest) {
        longest = f.steps;
        ended.parallel.pipe.stages = f.stages;
      }
    print_summary(ended, results, rank, world, Comm::name, wall_s);
    if (const auto& found = hooks.site_maps[static_cast<std::size_t>(asker)]; found && p.sites == std::vector<std::string>{"auto"})
      std::printf("sites found by round trips: %s\n", found->describe().c_str());
    if (!p.sites.empty() && network) {
      std::vector<std::string> names = p.sites;  // (auto: the sites found)
      if (const auto& found = hooks.site_maps[static_cast<std::size_t>(asker)]; found && found->world() == p.world && names.size() == 1)
        for (names.clear(); static_cast<int>(names.size()) < p.world;)
          names.push_back(found->name(found->site_of(static_cast<int>(names.size()))));
      if (static_cast<int>(names.size()) == p.world) print_site_traffic(names, *network);  // (auto: once no peer was lost)
    }
    if (!p.sites.empty() && tcp_peer) print_link_traffic(p.sites[0], *tcp_peer);
    if (const auto& pick = hooks.ring_picks[static_cast<std::size_t>(asker)])
      std::printf("ring order measured: %s (its hops add up to %.1f ms, rank order's to %.1f ms)\n",
                  dt::collective::describe_order(pick->order).c_str(), 1e3 * pick->cost.total, 1e3 * pick->rank_order_cost.total);
    if (const auto& picks = hooks.picks[static_cast<std::size_t>(asker)]; !picks.empty())
      std::printf("auto: %zu pick%s; at the end %s (picked after step %lld: %s)\n", picks.size(), picks.size() == 1 ? "" : "s",
                  cli::describe_pick(picks.back()).c_str(), static_cast<long long>(picks.back().step), picks.back().why.c_str());
    if (const auto& last = hooks.last_exchanges[static_cast<std::size_t>(asker)])
      std::printf("auto: %s; through %s (%.3f s predicted, %.1f%% busy over the run)\n", last->why.c_str(), last->codec_name.c_str(),
                  last->exchange_s, 100 * last->busy);
    print_deadlines(hooks.deadline_runs);
    if (p.parallel.swarm) print_swarm(p, hooks.swarm_runs, hooks.rows_by_stage, wall_s);
    else if (p.parallel.stages() > 1) print_stages(p, results, hooks.stage_runs, rank);
    print_suspects(hooks.tallies[static_cast<std::size_t>(asker)]);
  }
  if (tcp_peer) print_transport(*tcp_peer);  // every process: what its own transport turned away
  return 0;
}

// The fault policy the plan asks for: elastic, or checkpoints.
template <class Comm>
int train_with(const train_plan& p, const dt::data::token_dataset& data, Comm comm) {
  if constexpr (requires { requires Comm::asynchronous; }) {  // (the trainer refuses fault::elastic with it)
    dt::detail::check(!p.elastic, "--comm ", Comm::name, " leaves each peer at its own step, and --elastic re-forms the group "
                      "at a step every member shares: they do not go together");
    return train(p, data, comm, p.checkpoints);
  } else if (p.elastic) {
    auto elastic = p.elastic_policy;
    elastic.checkpoints = p.checkpoints;
    return train(p, data, comm, elastic);
  }
  return train(p, data, comm, p.checkpoints);
}
// The heads of published weights: the safetensors file does not say (any divisor of the width
// loads), so Hugging Face's config.json beside it does when present, and --n-head must agree.
std::int64_t weights_heads(const fs::path& weights, const options& opt) {
  const auto given = opt.has("n-head") ? opt.integer("n-head") : 0;
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

// --init-from W.safetensors: the weights every peer starts from, and the model shape they imply
// (into `model`; a --block-size under their context crops their positions, as nanoGPT's
// crop_block_size; any other shape option given must agree).
std::shared_ptr<const dt::io::named_tensors> initial_weights(const options& opt, dt::nn::gpt_config& model) {
  const fs::path file = opt.text("init-from");
  dt::detail::check(!opt.flag("resume"), "--init-from starts a run from published weights and --resume continues one from ",
                    "its checkpoints: give one of them");
  auto weights = dt::io::load_safetensors(file);
  auto cfg = dt::train::gpt2_config(weights, weights_heads(file, opt));
  const auto agree = [&](const char* option, std::int64_t given, std::int64_t theirs) {
    dt::detail::check(!opt.has(option) || given == theirs, "--", option, " ", given, " contradicts --init-from ", file.string(),
                      ", which has ", theirs, " (leave the option out)");
  };
  agree("n-layer", model.n_layer, cfg.n_layer);
  agree("n-embd", model.n_embd, cfg.n_embd);
  dt::detail::check(!opt.has("subspace") || model.subspace == 0, "--subspace ", model.subspace, " contradicts --init-from ",
                    file.string(), ": GPT-2 weights fill a model without a subspace");
  dt::detail::check(!opt.flag("no-bias") || !cfg.bias, "--no-bias contradicts --init-from ", file.string(), ", which has biases");
  if (opt.has("block-size")) {
    dt::detail::check(model.block_size <= cfg.block_size, "--block-size ", model.block_size, " is more than --init-from's context of ",
                      cfg.block_size);
    for (auto& [name, t] : weights)
      if (name == "wpe.weight" || name == "transformer.wpe.weight") {  // its first rows: positions 0 .. T-1
        auto rows = dt::tensor<dt::cpu>::empty({model.block_size, t.size(1)}, t.dtype());
        std::memcpy(rows.raw_data(), t.contiguous().raw_data(), rows.nbytes());
        t = rows;
      }
    cfg.block_size = model.block_size;
  }
  cfg.dropout = model.dropout;
  model = cfg;
  return std::make_shared<const dt::io::named_tensors>(std::move(weights));
}

// What is about to train, on what, and how.
void describe_run(const train_plan& p, const training_data& data) {
  const auto& cfg = p.model;
  std::printf("model: %lld layers, %lld heads, width %lld, block %lld, vocab %lld: %.2fM parameters\n",
              static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.block_size), static_cast<long long>(cfg.vocab_size),
              static_cast<double>(cfg.parameter_count()) / 1e6);
  if (cfg.subspace > 0)
    std::printf("subspace: the residual stream learns in %lld of its %lld dimensions; stages send %lld numbers a token, %.1fx fewer\n",
                static_cast<long long>(cfg.subspace), static_cast<long long>(cfg.n_embd), static_cast<long long>(cfg.subspace),
                static_cast<double>(cfg.n_embd) / static_cast<double>(cfg.subspace));
  std::printf("data: %s, %zu training and %zu validation tokens\n", data.source.c_str(),
              data.dataset.tokens(dt::data::split::train).size(), data.dataset.tokens(dt::data::split::validation).size());
  if (p.mode == launch::in_process)
    std::printf("%d in-process peers over simulated '%s' links, %d thread(s) each\n", p.world, p.link.c_str(), p.threads);
  if (p.device.cuda) std::printf("device: %s\n", p.gpus.c_str());
  std::fflush(stdout);
}

// --auto's codecs to pick from: --codec's alone where given (only the steps tuned), else these,
// least lossy first; an aggregator that combines per partition sends f32 only.
void add_tuned_codecs(const options& opt, const train_plan& p, std::vector<cli::codec>& codecs) {
  if (!opt.has("codec") && !p.aggregator.per_partition())
    for (const char* spec : {"identity", "int8", "int4"}) codecs.push_back(dt::collective::parse_codec(spec));
}

// --rebalance-every: a move is a re-deal, which --elastic makes.
void pools_rebalance(const options& opt, train_plan& p) {
  p.parallel.pools.rebalance_every = static_cast<int>(opt.integer("rebalance-every"));
  dt::detail::check(p.parallel.pools.rebalance_every == 0 || p.elastic, "--rebalance-every needs --elastic (a peer that moves "
                    "takes its new stage's state as the group re-deals its parts)");
}

// --parallel swarm and its settings, checked against the peers and the model.
void swarm_settings(const options& opt, train_plan& p) {
  for (const char* o : {"schedule", "replicas"}) dt::detail::check(!opt.has(o), "--", o, " needs --parallel pipeline (swarm has no fixed copies or schedule)");
  pools_rebalance(opt, p);
  p.parallel.swarm = true;
  auto& pools = p.parallel.pools;
  pools.stages = static_cast<int>(opt.integer("stages"));
  pools.micro_batches = opt.has("micro-batches") ? static_cast<int>(opt.integer("micro-batches")) : pools.stages;
  pools.codec = cli::from_flag("--activation-codec", [&] { return dt::collective::parse_codec(opt.text("activation-codec")); });
  p.parallel.pipe.stages = 1;  // (the pipeline is not used)
  dt::detail::check(pools.stages <= p.model.n_layer, "--stages ", pools.stages, " cuts a model of ", p.model.n_layer,
                    " layers (--n-layer); each stage needs at least one, so that must be at most ", p.model.n_layer);
  dt::detail::check(pools.micro_batches <= p.trainer.batch_size, "--micro-batches ", pools.micro_batches, " cuts ",
                    p.trainer.batch_size, " rows (--batch-size); it must be at most --batch-size");
  if (p.mode == launch::mpi) return;  // the world is known once MPI starts; the policy checks it then
  const int world = world_size_of(p);
  dt::detail::check(world >= pools.stages, "--parallel swarm: ", world, " peer(s) cannot hold --stages ", pools.stages,
                    " (every stage needs a peer)");
}

// --parallel pipeline and its settings, checked against the peers and the model.
void pipeline_settings(const options& opt, train_plan& p) {
  const auto parallel = opt.text("parallel");
  if (parallel != "swarm") dt::detail::check(!opt.has("rebalance-every"), "--rebalance-every needs --parallel swarm");
  if (parallel == "data") {
    for (const char* o : {"stages", "micro-batches", "schedule", "replicas", "activation-codec"})
      dt::detail::check(!opt.has(o), "--", o, " needs --parallel pipeline", std::string(o) == "stages" || std::string(o) == "micro-batches" ||
                                                                             std::string(o) == "activation-codec"
                                                                         ? " or swarm"
                                                                         : "");
    p.parallel.pipe.stages = p.parallel.pipe.micro_batches = 1;
    return;
  }
  dt::detail::check(p.init == nullptr, "--parallel ", parallel, " does not take --init-from yet");
  if (parallel == "swarm") {
    swarm_settings(opt, p);
    return;
  }
  auto& pipe = p.parallel.pipe;
  pipe.stages = static_cast<int>(opt.integer("stages"));
  pipe.micro_batches = opt.has("micro-batches") ? static_cast<int>(opt.integer("micro-batches")) : pipe.stages;
  const auto schedule = opt.text("schedule");
  const auto colon = schedule.find(':');
  pipe.schedule = schedule.substr(0, colon);
  pipe.chunks = dt::parallel::schedule::default_chunks(pipe.schedule);
  if (pipe.schedule == "interleaved") {
    if (colon != std::string::npos) {
      const auto setting = schedule.substr(colon + 1);
      const auto v = setting.rfind("v=", 0) == 0 ? cli::parse_integer(setting.substr(2)) : std::nullopt;
      dt::detail::check(v && *v >= 1 && *v <= 4096, "--schedule ", schedule, ": expected interleaved:v=N with N in [1, 4096]");
      pipe.chunks = static_cast<int>(*v);
    }
  } else {
    dt::detail::check(schedule == "gpipe" || schedule == "1f1b" || schedule == "zb-h1" || schedule == "zb-v",
                      "--schedule: must be gpipe, 1f1b, zb-h1, zb-v or interleaved[:v=N], got '", schedule, "'");
  }
  pipe.codec = cli::from_flag("--activation-codec", [&] { return dt::collective::parse_codec(opt.text("activation-codec")); });
  dt::detail::check(pipe.stages * pipe.chunks <= p.model.n_layer, "--stages ", pipe.stages,
                    pipe.chunks > 1 ? dt::detail::concat(" x ", pipe.chunks, " chunks") : std::string(), " cuts a model of ",
                    p.model.n_layer, " layers (--n-layer); each stage needs at least one, so that must be at most ",
                    p.model.n_layer);
  dt::detail::check(pipe.schedule != "interleaved" || pipe.micro_batches % pipe.stages == 0, "--schedule ", schedule,
                    ": --micro-batches (", pipe.micro_batches, ") must be a multiple of --stages (", pipe.stages, ")");
  dt::detail::check(pipe.micro_batches <= p.trainer.batch_size, "--micro-batches ", pipe.micro_batches, " cuts ",
                    p.trainer.batch_size, " rows (--batch-size); it must be at most --batch-size");
  if (p.mode == launch::mpi) return;  // the world is known once MPI starts; the policy checks it then
  const int world = world_size_of(p);
  dt::detail::check(world % pipe.stages == 0, "--parallel pipeline: ", world, " peers do not divide into copies of --stages ",
                    pipe.stages, " (the peers must be a multiple of the stages)");
  if (opt.has("replicas"))
    dt::detail::check(opt.integer("replicas") * pipe.stages == world, "--replicas ", opt.integer("replicas"), " x --stages ",
                      pipe.stages, " is not the ", world, " peers");
}

// --straggle P,F: a probability in [0, 1] and a factor >= 1.
dt::transport::in_process::options::straggling straggler_tail(const std::string& text) {
  const auto items = split_list(text, "straggle");
  dt::detail::check(items.size() == 2, "takes a probability and a factor, as 0.02,10; got '", text, "'");
  const auto number = [](const std::string& item) {
    const auto v = cli::parse_real(item);
    dt::detail::check(v.has_value(), "'", item, "' is not a number");
    return *v;
  };
  dt::transport::in_process::options::straggling tail;
  tail.probability = number(items[0]);
  tail.factor = number(items[1]);
  dt::detail::check(tail.probability >= 0 && tail.probability <= 1, "its probability must be in [0, 1], got ", items[0]);
  dt::detail::check(tail.factor >= 1, "its factor must be >= 1, got ", items[1]);
  return tail;
}

// --speeds: one number a peer, or "spread" (speeds::spread: 1x to 4x, dealt by the seed).
std::vector<double> peer_speeds(const std::string& text, int world, std::uint64_t seed) {
  if (text == "spread") return dt::transport::speeds::spread(world, seed);
  std::vector<double> out;
  for (const auto& item : split_list(text, "speeds")) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    dt::detail::check(end && *end == '\0' && v > 0 && std::isfinite(v), "'", item, "' is not a speed (a number > 0)");
    out.push_back(v);
  }
  dt::detail::check(static_cast<int>(out.size()) == world, "gives ", out.size(), " speeds for ", world, " peers (one each)");
  return out;
}

int cmd_train(const options& opt) {
  train_plan p;
  // (--join without --listen: a TCP peer that accepts no connections, as behind a NAT)
  const bool tcp = opt.has("listen") || opt.has("join");
  const int modes = int(opt.has("peers")) + int(tcp) + int(opt.flag("mpi"));
  dt::detail::check(modes <= 1, "--peers, --listen (or --join) and --mpi are different modes; give one of them");
  p.mode = opt.has("peers")    ? launch::in_process
           : tcp               ? launch::tcp
           : opt.flag("mpi")   ? launch::mpi
                               : launch::single;
  if (p.mode != launch::in_process)
    for (const char* o : {"link", "speeds", "straggle"})
      dt::detail::check(!opt.has(o), "--", o, " simulates the peers of --peers N; it needs --peers");
  if (p.mode != launch::tcp)
    for (const char* o : {"join", "advertise", "rank", "world", "join-timeout-ms", "peer-timeout-ms", "heartbeat-ms", "silence-ms",
                          "max-world", "key-file", "identity", "roster", "handshake-timeout-ms", "tls-cert", "tls-key", "tls-ca",
                          "tls-bind-ranks", "relay-circuits", "relay-rate", "punch-ms", "streams"})
      dt::detail::check(!opt.has(o), "--", o, " is for TCP peers; it needs --listen HOST:PORT (or --join HOST:PORT alone, for a ",
                        "peer that accepts no connections)");
  p.threads = threads(opt, p.mode == launch::single ? 0 : 1);
  if (p.mode == launch::in_process) {
    p.world = static_cast<int>(opt.integer("peers"));
    p.link = opt.text("link");
    if (opt.has("speeds"))
      p.speeds = cli::from_flag("--speeds", [&] {
        return peer_speeds(opt.text("speeds"), p.world, static_cast<std::uint64_t>(opt.integer("seed")));
      });
    if (opt.has("straggle")) p.straggle = cli::from_flag("--straggle", [&] { return straggler_tail(opt.text("straggle")); });
  } else if (p.mode == launch::tcp) {
    dt::detail::check(!opt.has("listen") || !opt.text("listen").empty(), "--listen '' names no address (leave --listen out ",
                      "for a peer that accepts no connections)");
    p.tcp.listen = opt.has("listen") ? opt.text("listen") : std::string();  // none: it dials every peer
    p.tcp.advertise = opt.text("advertise");
    p.tcp.join = split_list(opt.text("join"), "join");
    p.tcp.relay.max_circuits = static_cast<int>(opt.integer("relay-circuits"));
    p.tcp.relay.bytes_per_second = static_cast<std::uint64_t>(opt.real("relay-rate") * 1e6 / 8);
    p.tcp.punch_within = std::chrono::milliseconds(opt.integer("punch-ms"));
    p.tcp.streams_from_link = opt.text("streams") == "auto";
    p.tcp.streams = p.tcp.streams_from_link ? dt::transport::wire::max_streams : static_cast<int>(*cli::parse_integer(opt.text("streams")));
    p.tcp.rank = static_cast<int>(opt.integer("rank"));
    p.tcp.world = static_cast<int>(opt.integer("world"));
    p.tcp.join_timeout = std::chrono::milliseconds(opt.integer("join-timeout-ms"));
    p.tcp.recv_timeout = std::chrono::milliseconds(opt.integer("peer-timeout-ms"));
    const auto heartbeat = opt.integer("heartbeat-ms");
    p.tcp.heartbeat_interval = std::chrono::milliseconds(heartbeat);
    dt::detail::check(heartbeat > 0 || !opt.has("silence-ms"), "--silence-ms needs heartbeats (--heartbeat-ms above 0)");
    p.tcp.min_silence = std::chrono::milliseconds(opt.integer("silence-ms"));
    p.tcp.handshake_timeout = std::chrono::milliseconds(opt.integer("handshake-timeout-ms"));
    // Never on the command line, where `ps` shows it to every user of the machine.
    p.tcp.key = opt.has("key-file") ? dt::transport::auth::read_key_file(opt.text("key-file"))
                                    : dt::transport::auth::key_from_environment();
    for (const auto& [name, into] : {std::pair{"tls-cert", &p.tcp.tls.certificate}, std::pair{"tls-key", &p.tcp.tls.private_key},
                                     std::pair{"tls-ca", &p.tcp.tls.ca}})
      if (opt.has(name)) *into = opt.text(name);
    p.tcp.tls.bind_ranks = opt.flag("tls-bind-ranks");
    p.tcp.identity.identity = opt.text("identity");
    p.tcp.identity.roster = opt.text("roster");
    if (opt.flag("elastic")) {
      const auto most = opt.integer("max-world");
      dt::detail::check(most >= p.tcp.world, "--max-world must be at least --world (", p.tcp.world, "), got ", most);
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
  p.device = cli::parse_device(opt.text("device"));
#if DECENTRAIN_CLI_CUDA
  if (p.device.cuda) p.gpus = cli::check_gpus(p.device);
#else
  dt::detail::check(!p.device.cuda, "--device ", p.device.describe(), ": this decentrain-gpt was built without CUDA (build it where "
                    "nvcc is, at /usr/local/cuda or on the PATH, and the CMake configuration reports CUDA ON)");
#endif

  // Checkpoints: DIR/peer-R-of-W/step-N.ckpt in every mode; without a directory only Ctrl-C
  // saves, to ./checkpoints.
  const std::string dir = opt.text("checkpoint-dir");
  const auto save_every = opt.integer("save-every");
  const auto keep = opt.integer("keep-checkpoints");
  p.checkpoints.dir = dir.empty() ? "checkpoints" : dir;
  p.checkpoints.every = dir.empty() ? 0 : save_every;
  p.checkpoints.keep_last = static_cast<int>(keep);
  p.checkpoints.resume = opt.flag("resume");
  dt::detail::check(!p.checkpoints.resume || !dir.empty(),
                    "--resume needs --checkpoint-dir (Ctrl-C without one saves to ./checkpoints)");
  p.metrics = opt.text("metrics");
  p.quiet = opt.flag("quiet");
  if (opt.has("status-port")) p.status_port = static_cast<int>(opt.integer("status-port"));
  p.status_host = opt.text("status-host");
  p.log_every = opt.integer("log-every");
  p.elastic = opt.flag("elastic");
  if (p.elastic) {
    dt::detail::check(p.mode == launch::in_process || p.mode == launch::tcp,
                      "--elastic needs --peers N or --listen HOST:PORT (under MPI a dead rank ends the job unless the MPI "
                      "library has ULFM)");
    // Ctrl-C on one TCP peer: it leaves and the others go on; in-process peers stop together.
    p.trainer.stop_alone = p.mode == launch::tcp;
    const auto t = opt.integer("agreement-timeout-ms");
    p.elastic_policy.agreement.timeout = std::chrono::milliseconds(t);
    // How long a survivor may wait on a frozen peer before it notices and joins the agreement.
    const bool beats = p.tcp.heartbeat_interval.count() > 0;
    const auto frozen_found_in = beats ? p.tcp.min_silence : p.tcp.recv_timeout;
    dt::detail::check(p.mode != launch::tcp || p.elastic_policy.agreement.timeout > frozen_found_in,
                      "--agreement-timeout-ms (", t, ") must be more than ", beats ? "--silence-ms (" : "--peer-timeout-ms (",
                      frozen_found_in.count(), "): a peer may wait that long on a frozen one before it joins the agreement");
    for (const auto& k : split_list(opt.text("kill"), "kill")) {
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
    if (opt.has("exclude-after")) p.elastic_policy.exclusion = exclusion_rule(opt.text("exclude-after"));
    using when = dt::fault::elastic::when_left_out;
    p.elastic_policy.left_out = opt.text("left-out") == "rejoin" ? when::rejoin : when::stop;
    // In-process peers are only ever killed (--kill), never left out alive.
    dt::detail::check(p.elastic_policy.left_out == when::stop || p.mode == launch::tcp,
                      "--left-out rejoin needs --listen or --join (over TCP): in-process peers are never left out alive");
    dt::detail::check(p.elastic_policy.left_out == when::rejoin || !opt.has("rejoin-timeout-ms"),
                      "--rejoin-timeout-ms needs --left-out rejoin");
    p.elastic_policy.rejoin_timeout = std::chrono::milliseconds(opt.integer("rejoin-timeout-ms"));
  } else {
    for (const char* o : {"agreement-timeout-ms", "kill", "exclude-after", "left-out", "rejoin-timeout-ms"})
      dt::detail::check(!opt.has(o), "--", o, " needs --elastic");
  }

  const std::string comm = opt.has("comm") ? opt.text("comm") : p.mode == launch::single ? "sync" : "diloco";
  const bool streaming = comm == "streaming-diloco";
  dt::detail::check(streaming || !opt.has("fragments"), "--fragments needs --comm streaming-diloco");
  const bool push_sum = comm == "push-sum", moshpit = comm == "moshpit";
  dt::detail::check(streaming || comm == "diloco" || push_sum || !opt.has("overlap"),
                    "--overlap needs --comm diloco, streaming-diloco or push-sum");
  dt::detail::check(!push_sum || !opt.has("overlap") || opt.integer("overlap") <= 1,
                    "--overlap with --comm push-sum is 0 or 1 (OSGP: a round's messages taken a round late), got ",
                    opt.has("overlap") ? opt.integer("overlap") : 0);
  dt::detail::check(streaming || (opt.has("overlap") && !push_sum) || !opt.has("mix"),
                    "--mix needs --overlap with --comm diloco, or --comm streaming-diloco");
  const bool eager = opt.flag("eager");
  dt::detail::check(streaming || comm == "diloco" || !eager, "--eager needs --comm diloco or streaming-diloco");
  dt::detail::check(!eager || (!opt.has("overlap") && !opt.has("mix")),
                    "--eager overlaps each exchange with a whole round and steps at once: --overlap and --mix do not apply");
  const bool tuned = opt.flag("auto");
  dt::detail::check(!tuned || comm == "diloco" || streaming, "--auto picks the settings of DiLoCo's or Streaming DiLoCo's rounds: ",
                    "it needs --comm diloco or streaming-diloco, not --comm ", comm);
  dt::detail::check(!tuned || !streaming || (!opt.has("fragments") && !opt.has("overlap") && !eager),
                    "--auto with --comm streaming-diloco picks the fragments and the overlap: --fragments, --overlap and --eager ",
                    "do not go with it");
  const auto fragments = streaming && !tuned ? opt.integer("fragments") : 1;
  const auto overlap = push_sum || !opt.has("overlap") ? (streaming ? 1 : 0) : opt.integer("overlap");
  const bool osgp = push_sum && opt.has("overlap") && opt.integer("overlap") == 1;
  const double mix = opt.real("mix");
  const bool choco = comm == "choco", ad_psgd = comm == "ad-psgd";
  const bool graph = comm == "gossip" || push_sum || choco || ad_psgd;  // (--topology's)
  const auto inner = comm == "sync" || (graph && !opt.has("inner-steps")) ? 1 : opt.integer("inner-steps");
  dt::detail::check(!graph || choco || (!opt.has("codec") && !opt.has("aggregator")), "--comm ", comm,
                    " averages each peer's parameters with its neighbours' in f32: --codec and --aggregator do not apply "
                    "(--comm choco gossips through a codec)");
  dt::detail::check(!choco || !opt.has("aggregator"), "--comm choco adds its neighbours' public copies: --aggregator does not apply");
  dt::detail::check(graph || !opt.has("topology"),
                    "--topology is the graph of gossip, push-sum, ad-psgd and choco: it needs --comm gossip, push-sum, ad-psgd or choco");
  const std::string topology = opt.has("topology") ? opt.text("topology") : choco ? "ring" : ad_psgd ? "exponential" : "one-peer-exponential";
  dt::detail::check(!ad_psgd || (topology != "one-peer-exponential" && topology != "random"), "--comm ad-psgd keeps its open ",
                    "requests by neighbour, so its graph must not change with the round: --topology exponential, ring or torus, not ",
                    topology);
  dt::detail::check(!ad_psgd || !p.elastic, "--comm ad-psgd leaves each peer at its own step, and --elastic re-forms the group ",
                    "at a step every member shares: they do not go together (--save-every checkpoints at drains instead)");
  dt::detail::check(!choco || topology == "ring" || topology == "torus", "--comm choco keeps its neighbours' public copies, so ",
                    "its graph must be fixed and undirected: --topology ring or torus, not ", topology);
  dt::detail::check(choco || !opt.has("consensus-step"), "--consensus-step is CHOCO's: it needs --comm choco");
  const bool moshpit_outer = opt.has("outer-averaging") && opt.text("outer-averaging") == "moshpit";
  dt::detail::check(comm == "diloco" || !opt.has("outer-averaging"), "--outer-averaging is DiLoCo's: it needs --comm diloco");
  dt::detail::check(!moshpit_outer || (!opt.has("overlap") && !eager), "--outer-averaging moshpit averages each round at once: ",
                    "--overlap and --eager (Streaming DiLoCo's) do not apply");
  dt::detail::check(moshpit || moshpit_outer || !opt.has("moshpit-group"),
                    "--moshpit-group needs --comm moshpit or --outer-averaging moshpit");
  const int moshpit_group = static_cast<int>(opt.integer("moshpit-group"));
  dt::detail::check(!opt.has("significance") || (comm == "diloco" && overlap == 0 && !eager),
                    "--significance filters DiLoCo's pseudo-gradients against its global parameters: it needs --comm diloco ",
                    "(without --overlap or --eager)");
  dt::detail::check(!opt.has("significance") || opt.has("codec"), "--significance needs a sparse codec with error feedback ",
                    "to hold back what it filters: add --codec, for example topk:0.03,chunk=4096,int2,ef=0.95");
  const auto codec_choice = cli::from_flag(opt.has("significance") ? "--codec with --significance" : "--codec", [&] {
    std::string spec = choco && !opt.has("codec") ? std::string("sign") : opt.text("codec");
    if (opt.has("significance"))  // Gaia's filter goes inside the codec's error feedback (compress/parse_codec.hpp)
      spec += (spec.find(':') == std::string::npos ? ":" : ",") + std::string("significance=") + opt.text("significance");
    return dt::collective::parse_codec(spec);
  });
  p.aggregator = cli::from_flag("--aggregator", [&] { return dt::collective::parse_aggregator(opt.text("aggregator")); });
  dt::detail::check(!p.aggregator.per_partition() || codec_choice.describe() == "identity", "--aggregator '",
                    p.aggregator.describe(), "' aggregates per partition, which sends f32 values: it needs --codec identity, not '",
                    codec_choice.describe(), "'");
  dt::detail::check(!tuned || streaming || (overlap == 0 && !eager && !moshpit_outer && !opt.has("significance")),
                    "--auto picks H and the codec of DiLoCo rounds that exchange at their ends, all at once: --overlap, ",
                    "--eager, --significance and --outer-averaging moshpit do not go with it");
  const bool sized_to_speed = opt.flag("sized-to-speed") || (tuned && !streaming);
  dt::detail::check(!sized_to_speed || ((comm == "diloco" || streaming) && !eager && !moshpit_outer),
                    "--sized-to-speed sizes DiLoCo's rounds: it needs --comm diloco or streaming-diloco (without --eager or "
                    "--outer-averaging moshpit)");
  const bool deadline = opt.flag("deadline");
  dt::detail::check(!deadline || (opt.flag("sized-to-speed") && comm == "diloco" && overlap == 0 && !tuned && !opt.has("site") &&
                                   (!opt.has("ring-order") || opt.text("ring-order") == "rank")),
                    "--deadline closes DiLoCo's rounds sized to speed: it needs --comm diloco --sized-to-speed, and not ",
                    "--overlap, --auto, --ring-order or --site");
  const std::int64_t target_batch = opt.has("target-batch") ? opt.integer("target-batch") : 0;
  dt::detail::check(target_batch == 0 || comm == "sync", "--target-batch sizes synchronous steps: it needs --comm sync, not ",
                    comm, " (--sized-to-speed sizes DiLoCo's rounds)");
  dt::detail::check(target_batch == 0 || p.aggregator.averages_in_flight(), "--target-batch weighs each peer by the rows ",
                    "it was dealt, which --aggregator ", p.aggregator.describe(), " caps: it needs --aggregator mean");
  dt::detail::check(opt.has("site") || !opt.flag("sync-inside-site"), "--sync-inside-site needs --site");
  // --site: the sites (the simulated links of --peers, the summary's bytes per link), and by
  // default the average over them; --outer-averaging all-reduce keeps one flat all-reduce.
  const std::string averaging = opt.has("outer-averaging") ? opt.text("outer-averaging") : std::string();
  dt::detail::check(opt.has("site") || averaging != "sites", "--outer-averaging sites needs --site");
  p.average_by_sites = opt.has("site") && !moshpit_outer && averaging != "all-reduce";
  dt::detail::check(!opt.has("site") || p.average_by_sites || (!opt.flag("sync-inside-site") && opt.text("site") != "auto"),
                    "--outer-averaging all-reduce averages flat: ", opt.text("site") == "auto" ? "--site auto finds" : "--sync-inside-site needs",
                    " the sites of the average over sites (--outer-averaging sites)");
  if (p.average_by_sites) {
    dt::detail::check((comm == "diloco" && overlap == 0 && !eager) || comm == "sync", "--site averages sync's gradients or ",
                      "DiLoCo's rounds over sites: it needs --comm sync or diloco (without --overlap, --eager or "
                      "--outer-averaging moshpit), not ", comm);
    dt::detail::check(comm == "diloco" || !opt.flag("sync-inside-site"), "--sync-inside-site is DiLoCo's inner steps inside ",
                      "each site: --comm sync is synchronous everywhere already");
    dt::detail::check(!sized_to_speed && !opt.has("significance") && target_batch == 0, "--site averages over sites in one ",
                      "plain mean: ", tuned ? "--auto" : sized_to_speed ? "--sized-to-speed" : target_batch > 0 ? "--target-batch" : "--significance",
                      " does not go with it");
    dt::detail::check(p.aggregator.averages_in_flight(), "--site sums on the way between sites, which --aggregator ",
                      p.aggregator.describe(), " does not allow: it needs --aggregator mean");
    dt::detail::check(codec_choice.is_dense(), "--site adds the codec's payloads on the way, which --codec ", codec_choice.describe(),
                      "'s cannot be: use identity, fp16, bf16, int8, int4 or fp4");
  }
  // --ring-order: the flat all-reduce's ring (--auto's by round trips unless given).
  const std::string ring_order = opt.has("ring-order") ? opt.text("ring-order") : tuned && !streaming ? "latency" : "rank";
  std::optional<dt::comm::measured_ring> ring;
  if (ring_order != "rank") {
    dt::detail::check((comm == "sync" || (comm == "diloco" && overlap == 0 && !eager && !moshpit_outer)) && !p.average_by_sites,
                      "--ring-order ", ring_order, " orders the ring of one all-reduce among all peers: it needs --comm sync ",
                      "or diloco (without --overlap, --eager, --outer-averaging moshpit or the average over --site's sites)");
    ring.emplace();
    if (ring_order == "bandwidth") ring->probe_bytes = 64 << 10;
  }
  if (opt.has("site")) {
    dt::detail::check(!moshpit_outer, "--outer-averaging moshpit averages in the groups of a grid, not over --site's sites");
    p.sites = split_list(opt.text("site"), "site");
    for (const auto& name : p.sites)
      dt::detail::check(!name.empty() && name.size() <= dt::collective::site_map::max_name_bytes, "--site: '", name,
                        "' is not a site name (1 to ", dt::collective::site_map::max_name_bytes, " bytes)");
    if (p.mode == launch::in_process && p.sites != std::vector<std::string>{"auto"})
      dt::detail::check(static_cast<int>(p.sites.size()) == p.world, "--site gives ", p.sites.size(), " names for ", p.world,
                        " peers (with --peers, one a peer: --site a,a,b,b; or auto)");
    else
      dt::detail::check(p.sites.size() == 1, "--site gives ", p.sites.size(), " names; over TCP or MPI it names this peer's site");
  }
  const bool outer = comm == "diloco" || streaming;
  const double outer_lr = outer ? opt.real("outer-lr") : 0.0;
  const double outer_momentum = outer ? opt.real("outer-momentum") : 0.0;

  // A resumed run takes the model's shape and the tokenizer from its checkpoints.
  std::optional<dt::io::checkpoint> resumed;
  fs::path resumed_from;
  if (p.checkpoints.resume) {
    auto [file, c] = newest_checkpoint(p.checkpoints, p.mode == launch::tcp ? p.tcp.rank : 0, p.elastic ? 0 : p.world, p.elastic);
    resumed_from = file;
    resumed = std::move(c);
  }
  p.model = model_config(opt);
  if (opt.has("init-from")) p.init = initial_weights(opt, p.model);
  auto data = load_training_data(opt, p.model.vocab_size, resumed ? &*resumed : nullptr);
  if (p.init) {
    dt::detail::check(!data.tokenizer || data.tokenizer->vocab_size() == p.model.vocab_size ||
                          (data.tokenizer->name == "gpt2" && p.model.vocab_size >= data.tokenizer->vocab_size()),
                      "--init-from ", opt.text("init-from"), " has a vocabulary of ", p.model.vocab_size, ", the data's ",
                      data.tokenizer ? data.tokenizer->name : "", " tokenizer ",
                      data.tokenizer ? data.tokenizer->vocab_size() : 0, " ids that mean other things (GPT-2 weights need GPT-2's tokens: "
                      "--tokenizer gpt2, or shards made by prepare)");
    dt::detail::check(data.vocab_size <= p.model.vocab_size, "the data's ids reach ", data.vocab_size, ", beyond --init-from's vocabulary of ",
                      p.model.vocab_size);
  } else {
    p.model.vocab_size = data.vocab_size;
  }
  p.checkpoints.text["run.comm"] = comm;
  if (resumed) {
    check_resume_agrees(*resumed, resumed_from, opt, p.model, comm);
    p.model = dt::train::config_of<dt::nn::gpt_config>(*resumed);
  }
  if (data.tokenizer) data.tokenizer->record(p.checkpoints.text);
  pipeline_settings(opt, p);
  dt::detail::check(!sized_to_speed || p.parallel.stages() == 1, opt.flag("sized-to-speed") ? "--sized-to-speed" : "--auto", " gives a peer several ",
                    "inner steps in one step, which a peer holding one stage of a pipeline cannot take: it needs --parallel data");
  dt::detail::check(target_batch == 0 || p.parallel.stages() == 1, "--target-batch adds micro-batches up on a peer holding ",
                    "the whole model: it needs --parallel data, not ", opt.text("parallel"));
  dt::detail::check(target_batch == 0 || target_batch >= p.trainer.batch_size, "--target-batch ", target_batch,
                    " is less than one micro-batch of --batch-size ", p.trainer.batch_size, " rows");
  dt::detail::check(!p.parallel.swarm || p.sites.empty(), "--parallel swarm cannot take --site: a stage's pool averages ",
                    "weighted by the rows each peer processed, and the average over sites is one plain mean");
  dt::detail::check(!p.parallel.swarm || !choco, "--parallel swarm cannot take --comm choco: a stage's pool averages ",
                    "weighted by the rows each peer processed, and CHOCO keeps only the sum of its neighbours' public copies, ",
                    "which cannot be weighed (use sync, local-sgd, diloco, streaming-diloco, moshpit, gossip or push-sum)");
  dt::detail::check(!p.parallel.swarm || !ad_psgd, "--parallel swarm cannot take --comm ad-psgd: a SWARM step passes ",
                    "activations between every stage's pools, so its peers step together and AD-PSGD's exchanges gain nothing ",
                    "(use gossip or push-sum)");
  dt::detail::check(!p.elastic || p.parallel.stages() == 1 || !(streaming || overlap > 0 || eager),
                    "--parallel ", opt.text("parallel"), " with --elastic cannot take --comm streaming-diloco, nor --comm diloco with ",
                    "--overlap or --eager (Streaming DiLoCo): when peers are lost the stages' parts are dealt out again, ",
                    "and its fragments' state is not laid out over the parameters to follow them (sync, local-sgd, diloco ",
                    "and gossip can)");
  // (a GPU's allocator refuses what does not fit on the GPU itself, naming the allocation)
  if (!p.device.cuda) check_fits_in_memory(p.model, p.trainer.batch_size, p.mode == launch::in_process ? p.world : 1);
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
      .add("device", p.device.describe())
      .add("data", data.source)
      .add("n_layer", p.model.n_layer)
      .add("n_head", p.model.n_head)
      .add("n_embd", p.model.n_embd)
      .add("block_size", p.model.block_size)
      .add("vocab_size", p.model.vocab_size)
      .add("dropout", p.model.dropout)
      .add("subspace", p.model.subspace)
      .add("eval_every", p.trainer.eval_every)
      .add("eval_batches", p.trainer.eval_batches)
      .add("threads_per_peer", p.threads)
      .add("resume", p.checkpoints.resume)
      .add("init_from", opt.text("init-from"));
  if (p.mode == launch::in_process) p.run.add("link", p.link);
  if (!p.speeds.empty()) {
    std::string list;
    for (const double v : p.speeds) list += (list.empty() ? "" : ",") + dt::detail::concat(v);
    p.run.add("speeds", list);
  }
  if (p.straggle.probability > 0) p.run.add("straggle", dt::detail::concat(p.straggle.probability, ",", p.straggle.factor));
  if (comm != "sync") p.run.add("inner_steps", inner);
  if (graph) p.run.add("topology", topology);
  if (choco) p.run.add("consensus_step", opt.real("consensus-step"));
  if (push_sum) p.run.add("overlap", osgp ? 1 : 0);
  if (comm == "diloco") p.run.add("outer_averaging", moshpit_outer ? "moshpit" : p.average_by_sites ? "sites" : "all-reduce");
  if (moshpit || moshpit_outer) p.run.add("moshpit_group", moshpit_group);
  if (!p.sites.empty()) p.run.add("site", opt.text("site")).add("sync_inside_site", opt.flag("sync-inside-site"));
  p.run.add("codec", codec_choice.describe()).add("aggregator", p.aggregator.describe());
  if (p.parallel.swarm)
    p.run.add("parallel", "swarm")
        .add("stages", p.parallel.pools.stages)
        .add("micro_batches", p.parallel.pools.micro_batches)
        .add("rebalance_every", p.parallel.pools.rebalance_every)
        .add("activation_codec", p.parallel.pools.codec.describe());
  else if (p.parallel.stages() > 1)
    p.run.add("parallel", "pipeline")
        .add("stages", p.parallel.pipe.stages)
        .add("micro_batches", p.parallel.pipe.micro_batches)
        .add("schedule", p.parallel.pipe.schedule)
        .add("chunks", p.parallel.pipe.chunks)
        .add("activation_codec", p.parallel.pipe.codec.describe());
  if (outer) p.run.add("outer_lr", outer_lr).add("outer_momentum", outer_momentum);
  if (sized_to_speed) p.run.add("sized_to_speed", true);
  if (deadline) p.run.add("deadline", true);
  if (tuned) p.run.add("auto", true);
  if (ring) p.run.add("ring_order", ring_order);
  if (target_batch > 0) p.run.add("target_batch", target_batch);
  if (eager) p.run.add("fragments", fragments).add("eager", true);
  else if (streaming || overlap > 0) p.run.add("fragments", fragments).add("overlap", overlap).add("mix", mix);

  // What every TCP peer of the run must agree on: a peer started otherwise is refused at once,
  // naming the difference (peers may differ in threads, batch size, files and timeouts).
  std::ostringstream agreed;
  agreed << "steps=" << p.trainer.steps << ";seed=" << p.trainer.seed << ";n_layer=" << p.model.n_layer
         << ";n_head=" << p.model.n_head << ";n_embd=" << p.model.n_embd << ";block_size=" << p.model.block_size
         << ";vocab_size=" << p.model.vocab_size << ";bias=" << p.model.bias << ";subspace=" << p.model.subspace << ";comm=" << comm << ";inner_steps=" << inner
         << ";codec=" << codec_choice.describe() << ";aggregator=" << p.aggregator.describe() << ";parallel=" << opt.text("parallel")
         << ";stages=" << p.parallel.stages() << ";micro_batches=" << p.parallel.micro_batches()
         << ";schedule=" << p.parallel.pipe.schedule << ";chunks=" << p.parallel.pipe.chunks
         << ";activation_codec=" << p.parallel.codec().describe() << ";rebalance_every=" << p.parallel.pools.rebalance_every;
  if (outer) agreed << ";outer_lr=" << outer_lr << ";outer_momentum=" << outer_momentum;
  if (sized_to_speed) agreed << ";sized_to_speed=1";
  if (deadline) agreed << ";deadline=1";
  if (tuned) agreed << ";auto=1";
  if (ring) agreed << ";ring=" << ring_order;
  if (target_batch > 0) agreed << ";target_batch=" << target_batch;
  if (graph) agreed << ";topology=" << topology;
  if (choco) agreed << ";consensus_step=" << opt.real("consensus-step");
  if (push_sum) agreed << ";osgp=" << osgp;
  if (moshpit || moshpit_outer) agreed << ";moshpit_group=" << moshpit_group << ";outer_averaging=" << moshpit_outer;
  if (!p.sites.empty())  // (each peer names its own)
    agreed << ";sites=" << (p.average_by_sites ? "average" : "links") << ";sync_inside_site=" << opt.flag("sync-inside-site");
  if (streaming || overlap > 0 || eager)
    agreed << ";fragments=" << fragments << ";overlap=" << overlap << ";mix=" << mix << ";eager=" << eager;
  p.tcp.settings = agreed.str();
  if (!p.quiet) describe_run(p, data);

  // One trainer type per policy (cli/peer.hpp), whatever the codec and aggregator.
  if (comm == "sync") {
    cli::sync_policy policy;  // (each peer's --site: cli::run_peer)
    policy.weighted = p.parallel.swarm;  // (a pool's peers weigh in by the rows they processed)
    policy.target_batch = target_batch;
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    policy.ring = ring;
    return train_with(p, data.dataset, policy);
  }
  if (comm == "gossip") {
    cli::gossip_policy policy;
    policy.weighted = p.parallel.swarm;  // (a pool's peers weigh in by the rows they processed)
    policy.inner_steps = inner;
    policy.topology = dt::comm::topology::named::parse(topology);
    policy.topology.seed = p.trainer.seed;  // (random's pairings: the same on every peer of the run)
    return train_with(p, data.dataset, policy);
  }
  if (push_sum) {
    cli::push_sum_policy policy;
    policy.weighted = p.parallel.swarm;  // (a pool's peers weigh in by the rows they processed)
    policy.inner_steps = inner;
    policy.topology = dt::comm::topology::named::parse(topology);
    policy.topology.seed = p.trainer.seed;
    policy.overlap = osgp;
    return train_with(p, data.dataset, policy);
  }
  if (ad_psgd) {
    cli::ad_psgd_policy policy;
    policy.inner_steps = inner;
    policy.topology = dt::comm::topology::named::parse(topology);
    policy.seed = p.trainer.seed;
    // Checkpoints at drains, where nothing is in flight: a resumed run then loses no exchange.
    policy.drain_every = p.checkpoints.every;
    return train_with(p, data.dataset, policy);
  }
  if (choco) {
    cli::choco_policy policy;
    policy.inner_steps = inner;
    policy.topology = dt::comm::topology::named::parse(topology);
    policy.codec = codec_choice;
    policy.consensus_step = opt.real("consensus-step");
    return train_with(p, data.dataset, policy);
  }
  if (moshpit) {
    cli::moshpit_policy policy;
    policy.weighted = p.parallel.swarm;  // (a pool's peers weigh in by the rows they processed)
    policy.inner_steps = inner;
    policy.grid.group_size = moshpit_group;
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    return train_with(p, data.dataset, policy);
  }
  if (comm == "local-sgd") {
    cli::local_sgd_policy policy;
    policy.weighted = p.parallel.swarm;  // (a pool's peers weigh in by the rows they processed)
    policy.inner_steps = inner;
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    return train_with(p, data.dataset, policy);
  }
  if (streaming || overlap > 0 || eager) {  // DiLoCo with overlap is Streaming DiLoCo with one fragment
    cli::streaming_policy policy;
    policy.weighted = p.parallel.swarm;  // (a pool's peers weigh in by the rows they processed)
    policy.codec = codec_choice;
    policy.aggregator = p.aggregator;
    policy.inner_steps = inner;
    policy.fragments = fragments;
    policy.overlap = overlap;
    policy.mix = mix;
    policy.eager = eager;
    policy.outer_optimizer.lr = outer_lr;
    policy.outer_optimizer.momentum = outer_momentum;
    policy.sized_to_speed = sized_to_speed;
    if (tuned) {
      policy.tune.emplace();
      add_tuned_codecs(opt, p, policy.tune->codecs);
    }
    return train_with(p, data.dataset, policy);
  }
  cli::diloco_policy policy;
  policy.weighted = p.parallel.swarm;
  policy.codec = codec_choice;
  policy.aggregator = p.aggregator;
  policy.inner_steps = inner;
  policy.outer_optimizer.lr = outer_lr;
  policy.outer_optimizer.momentum = outer_momentum;
  if (moshpit_outer) policy.moshpit = dt::comm::moshpit_grid{.group_size = moshpit_group};
  policy.sized_to_speed = sized_to_speed;
  policy.sync_inside_site = opt.flag("sync-inside-site");  // (each peer's site: cli::run_peer)
  policy.ring = ring;
  if (deadline) policy.deadline.emplace();
  if (tuned) {
    policy.tune.emplace();
    add_tuned_codecs(opt, p, policy.tune->codecs);
  }
  return train_with(p, data.dataset, policy);
}

// ---- eval ----------------------------------------------------------------------------------



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

// A checkpoint of a pipeline's stage holds that stage's part of the model: the files of the
// other stages of its copy, of the same step, join it into the whole model's.
dt::io::checkpoint joined_stages(dt::io::checkpoint c, const fs::path& file) {
  const auto it = c.counters.find("trainer.stages");
  if (it == c.counters.end() || it->second <= 1) return c;
  const auto stages = it->second, stage = c.counter("trainer.stage");
  const auto rank = c.counter("trainer.rank"), world = c.counter("trainer.world");
  const auto run = file.parent_path().parent_path();
  for (std::int64_t s = 0; s < stages; ++s) {
    if (s == stage) continue;
    const auto other = run / ("peer-" + std::to_string(rank - stage + s) + "-of-" + std::to_string(world)) / file.filename();
    dt::detail::check(fs::exists(other), file.string(), " holds stage ", stage, " of a ", stages, "-stage pipeline; stage ", s,
                      "'s file of the same step, ", other.string(), ", is missing (give the run's --checkpoint-dir, whose "
                      "stages are joined into the whole model)");
    const auto theirs = dt::io::load_checkpoint(other);
    const auto own = [](const std::string& name) { return name.rfind("model.", 0) == 0 || name.rfind("adamw.", 0) == 0; };
    for (const auto& [name, t] : theirs.tensors)
      if (own(name)) c.tensors.emplace(name, t);
    for (const auto& [name, v] : theirs.counters)
      if (own(name)) c.counters.emplace(name, v);
  }
  return c;
}

// The model `eval`, `sample` and `export` work on: --checkpoint FILE|DIR (a run's own, with its
// tokenizer) or --weights W.safetensors (published GPT-2 weights: n_head from config.json beside
// them or --n-head; GPT-2's tokenizer for 50257 ids, where its vocabulary is found). --tokenizer
// names one for a model that names none, and may not contradict one that does.
struct loaded_model {
  std::optional<dt::nn::gpt<>> model;
  std::optional<text_tokenizer> tokenizer;
};
loaded_model load_model(const options& opt, const char* doing) {
  const std::string ckpt = opt.text("checkpoint"), weights = opt.text("weights");
  const std::string command = opt.command().get_name();
  dt::detail::check(ckpt.empty() != weights.empty(), command, " needs exactly one of --checkpoint and --weights");
  dt::detail::check(!weights.empty() || !opt.has("n-head"), "--n-head goes with --weights (a checkpoint knows its heads)");
  const std::string tokenizer_name = opt.command().get_option_no_throw("--tokenizer") ? opt.text("tokenizer") : "";
  loaded_model out;
  auto& tok = out.tokenizer;
  if (!tokenizer_name.empty()) tok = text_tokenizer::make(tokenizer_name, opt, {});
  dt::rng unused(0, "init");
  if (!ckpt.empty()) {
    const auto file = checkpoint_file(ckpt);
    const auto c = joined_stages(dt::io::load_checkpoint(file), file);
    out.model.emplace(dt::train::config_of<dt::nn::gpt_config>(c), unused);
    dt::optim::adamw<> ignored(out.model->parameters());
    dt::train::restore(c, *out.model, ignored);
    if (auto own = text_tokenizer::of(c, opt)) {
      dt::detail::check(!tok || tok->name == own->name, "--tokenizer ", tokenizer_name, " contradicts the checkpoint's ",
                        own->name, " tokenizer");
      tok = std::move(own);
    }
    if (file != fs::path(ckpt)) std::fprintf(stderr, "%s %s\n", doing, file.c_str());
  } else {
    const auto n_head = weights_heads(weights, opt);
    const auto file = dt::io::load_safetensors(weights);
    out.model.emplace(dt::train::gpt2_config(file, n_head), unused);
    dt::train::import_gpt2_weights(*out.model, file);
    // Published GPT-2 weights: GPT-2's vocabulary, where it is found (else ids are printed).
    if (!tok && out.model->config().vocab_size == 50257) {
      try {
        tok = text_tokenizer::make("gpt2", opt, {});
      } catch (const dt::error&) {
        if (opt.has("vocab")) throw;
      }
    }
  }
  return out;
}

int cmd_sample(const options& opt) {
  set_threads(threads(opt, 0));
  const std::string prompt = opt.text("prompt"), prompt_ids = opt.text("prompt-ids");
  dt::nn::sample_options sampling;
  sampling.tokens = opt.integer("tokens");
  sampling.top_k = opt.integer("top-k");
  sampling.temperature = opt.real("temperature");
  dt::rng gen(static_cast<std::uint64_t>(opt.integer("seed")), "sample");
  auto loaded = load_model(opt, "sampling from");
  auto& model = loaded.model;
  auto& tok = loaded.tokenizer;
  const auto& cfg = model->config();
  dt::detail::check(!tok || tok->vocab_size() <= cfg.vocab_size, "the ", tok ? tok->name : "", " tokenizer has ",
                    tok ? tok->vocab_size() : 0, " ids, more than the model's vocabulary of ", cfg.vocab_size);
  std::vector<std::int32_t> ids;
  if (!prompt_ids.empty()) {
    for (const auto& part : split_list(prompt_ids, "prompt-ids")) {
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

// ---- eval and export -----------------------------------------------------------------------

// The mean loss over --batches consecutive batches of B rows of T+1 tokens (T inputs, the next T
// as targets) from the start of --tokens SHARD, or of --text FILE encoded with the model's
// tokenizer. With --dump-grads (one batch), also d loss / d weights under the weights' names.
int cmd_eval(const options& opt) {
  set_threads(threads(opt, 0));
  const std::string shard = opt.text("tokens"), text = opt.text("text"), dump = opt.text("dump-grads");
  const auto B = opt.integer("batch-size");
  const auto batches = opt.integer("batches");
  dt::detail::check(shard.empty() != text.empty(), "eval needs exactly one of --tokens SHARD and --text FILE");
  dt::detail::check(dump.empty() || batches == 1, "--dump-grads writes one batch's gradients: leave out --batches");
  auto loaded = load_model(opt, "evaluating");
  auto& model = *loaded.model;
  const auto& cfg = model.config();
  const auto T = opt.has("block-size") ? opt.integer("block-size") : std::min<std::int64_t>(64, cfg.block_size);
  dt::detail::check(T <= cfg.block_size, "--block-size ", T, " is more than the model's context of ", cfg.block_size);
  std::vector<std::int32_t> tokens;
  if (!shard.empty()) {
    tokens = dt::io::read_token_shard(shard);
  } else {
    dt::detail::check(loaded.tokenizer.has_value(), "--text needs a tokenizer: this model names none; give --tokenizer gpt2|byte");
    tokens = loaded.tokenizer->encode(dt::io::read_file(text));
  }
  const auto& source = shard.empty() ? text : shard;
  const auto row = static_cast<std::size_t>(T + 1);
  const auto need = static_cast<std::size_t>(batches * B) * row;
  dt::detail::check(tokens.size() >= need, source, " holds ", tokens.size(), " tokens; ", batches, " batch(es) of ", B,
                    " rows of ", T + 1, " need ", need);
  double sum = 0;
  for (std::int64_t k = 0; k < batches; ++k) {
    std::vector<std::int32_t> x, y;
    for (std::int64_t b = 0; b < B; ++b) {
      const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(k * B + b) * row);
      x.insert(x.end(), first, first + T);
      y.insert(y.end(), first + 1, first + T + 1);
    }
    for (const auto* v : {&x, &y})
      for (auto t : *v)
        dt::detail::check(t >= 0 && t < cfg.vocab_size, "token ", t, " of ", source, " is outside the model's vocabulary of ",
                          cfg.vocab_size);
    std::optional<dt::no_grad> recording_off;  // gradients only for --dump-grads
    if (dump.empty()) recording_off.emplace();
    auto loss = model.loss(dt::from_vector(x, {B, T}), dt::from_vector(y, {B, T}));
    sum += loss.item();
    if (!dump.empty()) {
      loss.backward();
      dt::io::named_tensors grads;
      for (const auto& e : model.parameters()) grads.emplace(e.name, e.param.grad());
      dt::io::save_safetensors(dump, grads);
    }
  }
  std::printf("loss %.9g\n", sum / static_cast<double>(batches));
  if (batches > 1) std::fprintf(stderr, "(the mean of %lld batches of %lld x %lld tokens)\n", static_cast<long long>(batches),
                                static_cast<long long>(B), static_cast<long long>(T));
  if (!dump.empty()) std::printf("gradients written to %s\n", dump.c_str());
  return 0;
}

// A run's checkpoint as published weights: W.safetensors under Hugging Face's GPT-2 names, and
// config.json beside it (so eval, sample and train --init-from know its heads).
int cmd_export(const options& opt) {
  const fs::path out = opt.text("out");
  dt::detail::check(out.extension() == ".safetensors", "--out ", out.string(), " must end in .safetensors");
  auto loaded = load_model(opt, "exporting");
  const auto& cfg = loaded.model->config();
  const auto folder = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  dt::io::make_folder(folder);
  const auto config = folder / "config.json";
  dt::detail::check(!fs::exists(config) || opt.flag("force"), config.string(),
                    " exists (it describes other weights?): choose another folder, or --force to replace it");
  dt::io::save_safetensors(out, dt::train::export_gpt2_weights(*loaded.model));
  std::ostringstream json;
  json << "{\"model_type\": \"gpt2\", \"n_layer\": " << cfg.n_layer << ", \"n_head\": " << cfg.n_head
       << ", \"n_embd\": " << cfg.n_embd << ", \"n_positions\": " << cfg.block_size << ", \"n_ctx\": " << cfg.block_size
       << ", \"vocab_size\": " << cfg.vocab_size << ", \"bias\": " << (cfg.bias ? "true" : "false");
  if (loaded.tokenizer) json << ", \"decentrain_tokenizer\": " << dt::io::json_quote(loaded.tokenizer->name);
  json << "}\n";
  dt::io::write_file_atomically(config, json.str());
  std::printf("exported %.2fM parameters to %s (and %s)\n", static_cast<double>(cfg.parameter_count()) / 1e6, out.c_str(),
              config.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "help";
  program prog;
  if (command == "version" || command == "--version") {
    std::printf("decentrain-gpt %s\n", dt::version.string);
    return 0;
  }
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(prog.app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  }
  CLI::App* cmd = cli::find_command(prog.app, command);
  if (cmd == nullptr || command.rfind("-", 0) == 0) {
    std::fprintf(stderr, "unknown command '%s'\n\n%s", command.c_str(), prog.app.help().c_str());
    return 2;
  }
  try {
    cli::parse(prog.app, *cmd, argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(cmd->help().c_str(), stdout);
    return 0;
  } catch (const cli::usage_error& e) {
    std::fprintf(stderr, "decentrain-gpt %s: error: %s\n", command.c_str(), e.what());
    return 2;
  }
  try {
    const options opt(*cmd);
    if (cmd == prog.train) return cmd_train(opt);
    if (cmd == prog.eval) return cmd_eval(opt);
    if (cmd == prog.sample) return cmd_sample(opt);
    if (cmd == prog.export_) return cmd_export(opt);
    return cmd_prepare(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decentrain-gpt %s: error: %s\n", command.c_str(), cli::with_flags(e.what()).c_str());
    return 1;
  }
}
