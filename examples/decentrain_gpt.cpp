// decentrain-gpt: train (on one machine or as decentralized peers), evaluate and sample GPT-2 models.
//
//   decentrain-gpt train  [--preset NAME | --n-layer L --n-head H --n-embd C --block-size T]
//                         [--data FILE] [--steps N] [--batch-size B] [--lr LR] [--seed S]
//                         [--checkpoint-dir DIR] [--resume] [--threads N] [--metrics FILE] ...
//   decentrain-gpt eval   --weights W.safetensors --tokens SHARD --n-head H
//                         [--batch-size B] [--block-size T] [--dump-grads G.safetensors]
//   decentrain-gpt sample (--checkpoint FILE | --weights W.safetensors --n-head H)
//                         [--prompt TEXT | --prompt-ids 1,2,3] [--tokens N] [--temperature X]
//                         [--top-k K] [--seed S]
//
// `decentrain-gpt help` lists every option with its default.
#include <decentrain/decentrain.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dt = decentrain;
namespace fs = std::filesystem;

namespace {

// Set by SIGINT; the training loop checks it between steps, saves a checkpoint and exits.
volatile std::sig_atomic_t interrupted = 0;
extern "C" void on_interrupt(int) { interrupted = 1; }

const char* usage = R"(decentrain-gpt: train, evaluate and sample GPT-2 models on one machine.

decentrain-gpt train [options]
  --preset NAME          tiny | shakespeare-char | gpt2-124m   (default tiny)
  --n-layer/--n-head/--n-embd/--block-size N   override the preset
  --dropout P            (default: the preset's)
  --no-bias              no biases in linears and layer norms (nanoGPT's bias=False)
  --data FILE            a text file (character-level) or an llm.c token shard;
                         default: the built-in generated corpus
  --vocab-size N         vocabulary for token shards (default: the preset's)
  --val-fraction F       held-out fraction of the data (default 0.1)
  --steps N              optimizer steps in all (default 1000)
  --batch-size B         sequences per step (default 16)
  --lr LR                peak learning rate (default 1e-3)
  --min-lr LR            cosine floor (default lr / 10)
  --warmup N             warmup steps (default steps / 20)
  --weight-decay W       AdamW weight decay on matrices (default 0.1)
  --beta2 B              AdamW beta2 (default 0.99)
  --grad-clip X          global-norm clip, 0 to disable (default 1.0)
  --compute-dtype T      f32 (default) or bf16: mixed precision, bf16 activations and products
                         with f32 weights, optimizer state and gradients
  --eval-every N         steps between evaluations (default 250)
  --eval-batches N       batches per evaluation (default 20)
  --checkpoint-dir DIR   where latest.ckpt goes (default: none; Ctrl-C then saves to ./checkpoints)
  --save-every N         steps between checkpoints when a directory is set (default 500)
  --keep-checkpoints     also keep DIR/step-N.ckpt for every save, not only latest.ckpt
  --resume               continue from DIR/latest.ckpt
  --metrics FILE         JSON lines of metrics (default metrics.jsonl; '' to disable)
  --seed S               seed of every random stream (default 1337)
  --threads N            CPU threads (default: OMP_NUM_THREADS or all cores; per peer)

  Decentralized training (one of the three modes; --batch-size is then per peer):
  --peers N              N peers as threads of this process, over simulated links
  --link NAME            ideal | lan | wan | heterogeneous (default lan)
  --listen HOST:PORT     this process is one TCP peer, listening here...
  --join HOST:PORT,...   ...joining through these peers (not for the first)
  --advertise HOST       the host others reach this peer at (needed with --listen 0.0.0.0:PORT)
  --rank R --world W     ...as peer R of W
  --mpi                  every rank of mpirun is a peer (when built with MPI)
  --link-in-flight MB    over TCP or MPI: the slowest link's bandwidth x latency in MB (100 Mbit/s
                         x 100 ms = 1.25), so all-reduces move enough per step to hide latency;
                         the same on every peer (simulated links size this on their own)
  --comm NAME            sync | local-sgd | diloco (default diloco)
  --inner-steps H        steps between averages for local-sgd and diloco (default 50)
  --outer-lr X           DiLoCo's outer Nesterov learning rate (default 0.7)
  --outer-momentum X     DiLoCo's outer momentum (default 0.9)
  With --checkpoint-dir, each peer saves DIR/peer-R-of-W.ckpt every --save-every steps (and
  DIR/step-N/ with --keep-checkpoints); --resume continues every peer from its own file. Ctrl-C
  does not save in these modes (the peers would have to agree on a step first).

decentrain-gpt eval --weights W.safetensors --tokens SHARD --n-head H [options]
  --batch-size B         rows (default 4)     --block-size T   tokens per row (default 64)
  --dump-grads FILE      also write d loss / d weights under the weights' names
  Reads the first B x (T+1) tokens as B rows (T inputs, the next T tokens as targets) and
  prints `loss <x>`.

decentrain-gpt sample (--checkpoint FILE | --weights W.safetensors --n-head H) [options]
  --prompt TEXT          (checkpoints with a character tokenizer)
  --prompt-ids I,J,...   token ids (any model)
  --tokens N             tokens to generate (default 200)
  --temperature X        (default 0.8)   --top-k K   (default 40; 0 = all)   --seed S
)";

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
  double real(const std::string& k, double fallback) const {
    used_.insert(k);
    if (!has(k)) return fallback;
    std::size_t n = 0;
    double v = 0;
    try { v = std::stod(values_.at(k), &n); } catch (const std::exception&) { n = 0; }
    dt::detail::check(n == values_.at(k).size() && n > 0, "--", k, " expects a number, got '", values_.at(k), "'");
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

void set_threads(const options& opt) {
  const auto n = opt.integer("threads", 0);
  dt::detail::check(n >= 0, "--threads must be >= 0");
#if defined(_OPENMP)
  if (n > 0) omp_set_num_threads(static_cast<int>(n));
#endif
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  return buf;
}

// ---- train ---------------------------------------------------------------------------------

struct training_data {
  dt::data::token_dataset dataset;
  std::optional<dt::data::char_tokenizer> tokenizer;  // for text data
  std::int64_t vocab_size;
  std::string source;
};

training_data load_training_data(const options& opt, std::int64_t preset_vocab, const dt::io::checkpoint* resume) {
  const double val_fraction = opt.real("val-fraction", 0.1);
  const std::string path = opt.text("data", "");
  if (!path.empty() && dt::io::is_token_shard(path)) {
    auto tokens = dt::io::read_token_shard(path);
    const auto vocab = opt.integer("vocab-size", preset_vocab);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      dt::detail::check(tokens[i] < vocab, "token ", tokens[i], " at index ", i, " of ", path, " is outside the vocabulary of ",
                        vocab, " (set --vocab-size)");
    return {dt::data::token_dataset(std::move(tokens), val_fraction), std::nullopt, vocab, path + " (token shard)"};
  }
  std::string text;
  if (path.empty()) {
    text = dt::data::builtin_corpus();
  } else {
    text = dt::io::read_file(path);
    dt::detail::check(!text.empty(), "--data ", path, " is empty");
  }
  // A resumed run keeps the tokenizer it started with.
  auto tok = resume && resume->text.count("tokenizer.alphabet") ? dt::data::char_tokenizer(resume->text.at("tokenizer.alphabet"))
                                                                : dt::data::char_tokenizer::from_text(text);
  auto tokens = tok.encode(text);
  const auto vocab = tok.vocab_size();
  return {dt::data::token_dataset(std::move(tokens), val_fraction), std::move(tok), vocab,
          path.empty() ? std::string("built-in corpus") : path + " (text, character-level)"};
}

int cmd_train_peers(const options& opt);

// The model shape from --preset and its overrides (the vocabulary comes from the data).
// --compute-dtype f32|bf16 (mixed precision).
dt::dtype compute_dtype(const options& opt) {
  const std::string name = opt.text("compute-dtype", "f32");
  if (name == "f32") return dt::dtype::f32;
  if (name == "bf16") return dt::dtype::bf16;
  dt::detail::fail("--compute-dtype must be f32 or bf16, got '", name, "'");
}

dt::nn::gpt_config model_config(const options& opt) {
  auto cfg = dt::nn::gpt_preset(opt.text("preset", "tiny"));
  cfg.n_layer = opt.integer("n-layer", cfg.n_layer);
  cfg.n_head = opt.integer("n-head", cfg.n_head);
  cfg.n_embd = opt.integer("n-embd", cfg.n_embd);
  cfg.block_size = opt.integer("block-size", cfg.block_size);
  cfg.dropout = opt.real("dropout", cfg.dropout);
  cfg.bias = !opt.has("no-bias");
  opt.text("no-bias", "");
  return cfg;
}

int cmd_train(const options& opt) {
  if (opt.has("peers") || opt.has("listen") || opt.has("mpi")) return cmd_train_peers(opt);
  set_threads(opt);
  const std::uint64_t seed = static_cast<std::uint64_t>(opt.integer("seed", 1337));
  const std::string ckpt_dir = opt.text("checkpoint-dir", "");
  const bool resume = opt.has("resume"), keep = opt.has("keep-checkpoints");
  opt.text("resume", "");
  opt.text("keep-checkpoints", "");
  std::optional<dt::io::checkpoint> resumed;
  if (resume) {
    dt::detail::check(!ckpt_dir.empty(), "--resume needs --checkpoint-dir");
    resumed = dt::io::load_checkpoint(fs::path(ckpt_dir) / "latest.ckpt");
  }

  auto cfg = model_config(opt);
  auto data = load_training_data(opt, cfg.vocab_size, resumed ? &*resumed : nullptr);
  cfg.vocab_size = data.vocab_size;
  if (resumed) cfg = dt::train::config_of(*resumed);

  const auto steps = opt.integer("steps", 1000);
  const auto B = opt.integer("batch-size", 16);
  const double lr = opt.real("lr", 1e-3);
  const dt::optim::cosine_schedule schedule{lr, opt.real("min-lr", lr / 10), opt.integer("warmup", steps / 20), std::max<std::int64_t>(steps, 1)};
  const double clip = opt.real("grad-clip", 1.0);
  const auto eval_every = opt.integer("eval-every", 250), eval_batches = opt.integer("eval-batches", 20);
  const auto save_every = opt.integer("save-every", 500);
  const std::string metrics_path = opt.text("metrics", "metrics.jsonl");
  const dt::optim::adamw_options adam{lr, 0.9, opt.real("beta2", 0.99), 1e-8, opt.real("weight-decay", 0.1)};
  const auto compute = compute_dtype(opt);
  opt.reject_unknown();
  dt::detail::check(steps > 0 && B > 0 && eval_every > 0 && eval_batches > 0 && save_every > 0,
                    "--steps, --batch-size, --eval-every, --eval-batches and --save-every must be positive");
  schedule.validate();
  const std::int64_t T = cfg.block_size;

  dt::rng init(seed, "init"), dropout_rng(seed, "dropout");
  dt::nn::gpt<> model(cfg, init);
  model.set_compute_dtype(compute);
  dt::optim::adamw<> optimizer(model.parameters(), adam);
  std::int64_t start = 0;
  if (resumed) {
    start = dt::train::restore(*resumed, model, optimizer);
    if (resumed->rngs.count("dropout")) dropout_rng.set_state(resumed->rngs.at("dropout"));
    std::printf("resumed from %s at step %lld\n", (fs::path(ckpt_dir) / "latest.ckpt").c_str(), static_cast<long long>(start));
  }

  auto save = [&](std::int64_t step, const std::string& dir) {
    fs::create_directories(dir);
    auto c = dt::train::capture(model, optimizer, step);
    c.rngs["dropout"] = dropout_rng.state();
    if (data.tokenizer) c.text["tokenizer.alphabet"] = data.tokenizer->alphabet();
    const auto path = fs::path(dir) / "latest.ckpt";
    dt::io::save_checkpoint(path, c);
    if (keep) dt::io::save_checkpoint(fs::path(dir) / ("step-" + std::to_string(step) + ".ckpt"), c);
    return path.string();
  };
  auto evaluate = [&] {
    dt::no_grad guard;
    double total = 0;
    for (std::int64_t i = 0; i < eval_batches; ++i) {
      auto [x, y] = data.dataset.batch(dt::data::split::validation, i, B, T, seed);
      total += model.loss(x, y).item();
    }
    return total / static_cast<double>(eval_batches);
  };

  std::ofstream metrics;
  if (!metrics_path.empty()) {
    metrics.open(metrics_path, resumed ? std::ios::app : std::ios::trunc);
    dt::detail::check(metrics.good(), "cannot open --metrics file ", metrics_path);
  }
  std::printf("model: %lld layers, %lld heads, width %lld, block %lld, vocab %lld: %.2fM parameters\n",
              static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.block_size), static_cast<long long>(cfg.vocab_size), static_cast<double>(cfg.parameter_count()) / 1e6);
  std::printf("data: %s, %zu training and %zu validation tokens\n", data.source.c_str(),
              data.dataset.tokens(dt::data::split::train).size(), data.dataset.tokens(dt::data::split::validation).size());
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  std::signal(SIGINT, on_interrupt);

  const auto t0 = std::chrono::steady_clock::now();
  double val = NAN;
  for (std::int64_t step = start; step < steps; ++step) {
    if (interrupted) {
      const auto path = save(step, ckpt_dir.empty() ? "checkpoints" : ckpt_dir);
      std::printf("\ninterrupted at step %lld: checkpoint saved to %s\n", static_cast<long long>(step), path.c_str());
      return 130;
    }
    auto [x, y] = data.dataset.batch(dt::data::split::train, step, B, T, seed);
    auto loss = model.loss(x, y, &dropout_rng);
    model.parameters().zero_grad();
    loss.backward();
    const double norm = clip > 0 ? dt::optim::clip_grad_norm(model.parameters(), clip) : 0.0;
    optimizer.set_lr(schedule(step));
    optimizer.step();

    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_s = static_cast<double>((step + 1 - start) * B * T) / elapsed;
    const double eta = elapsed / static_cast<double>(step + 1 - start) * static_cast<double>(steps - step - 1);
    if (metrics.is_open())
      metrics << "{\"step\":" << step + 1 << ",\"loss\":" << loss.item() << ",\"lr\":" << schedule(step)
              << ",\"grad_norm\":" << norm << ",\"tokens_per_s\":" << tokens_per_s << "}\n";
    if (tty) {
      const int width = 30, done = static_cast<int>(width * (step + 1) / steps);
      std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s   ", std::string(static_cast<std::size_t>(done), '=').c_str(),
                  std::string(static_cast<std::size_t>(width - done), ' ').c_str(), static_cast<long long>(step + 1),
                  static_cast<long long>(steps), loss.item(), tokens_per_s, format_duration(eta).c_str());
      std::fflush(stdout);
    } else if ((step + 1) % 50 == 0) {
      std::printf("step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s\n", static_cast<long long>(step + 1),
                  static_cast<long long>(steps), loss.item(), tokens_per_s, format_duration(eta).c_str());
    }
    if ((step + 1) % eval_every == 0 || step + 1 == steps) {
      val = evaluate();
      std::printf("%sstep %lld: val loss %.4f\n", tty ? "\n" : "", static_cast<long long>(step + 1), val);
      if (metrics.is_open()) metrics << "{\"step\":" << step + 1 << ",\"val_loss\":" << val << "}\n";
    }
    if (!ckpt_dir.empty() && ((step + 1) % save_every == 0 || step + 1 == steps)) save(step + 1, ckpt_dir);
  }
  if (std::isnan(val)) val = evaluate();  // resumed at or past --steps
  std::printf("val loss %.4f\n", val);
  std::printf("trained in %s\n", format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()).c_str());
  return 0;
}

// ---- train, decentralized ------------------------------------------------------------------

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Where peer `rank` of `world` keeps its checkpoint; one file per peer, so peers on different
// machines each keep their own.
fs::path peer_checkpoint(const std::string& dir, int rank, int world) {
  return fs::path(dir) / ("peer-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".ckpt");
}

struct peer_checkpointing {
  std::string dir;  // empty: none
  bool resume = false, keep = false;
  std::int64_t save_every = 500;
  std::string alphabet;  // the tokenizer's, stored with every checkpoint
};

template <class Comm>
int run_peers(const options& opt, const dt::nn::gpt_config& cfg, const training_data& data, dt::train::trainer_options topts,
              Comm comm, const peer_checkpointing& ck) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm>;
  const std::string mode = opt.has("peers") ? "in-process" : opt.has("listen") ? "tcp" : "mpi";
  const auto threads = opt.integer("threads", 1);
  dt::detail::check(threads >= 1, "--threads must be >= 1");
  auto save = [&ck](Trainer& t, const std::string& dir) {
    fs::create_directories(dir);
    auto c = t.capture();
    if (!ck.alphabet.empty()) c.text["tokenizer.alphabet"] = ck.alphabet;
    dt::io::save_checkpoint(peer_checkpoint(dir, t.rank(), t.world()), c);
  };
  auto report = [&](Trainer& t) {
    t.on_eval([&t](const dt::train::eval_point& p) {
      if (t.rank() == 0)
        std::printf("step %lld: val loss %.4f  (peer 0 sent %.2f MB, clock %.1f s)\n", static_cast<long long>(p.step), p.val_loss,
                    static_cast<double>(p.bytes_sent) / 1e6, p.clock_s);
      std::fflush(stdout);
    });
    if (ck.dir.empty()) return;
    if (ck.resume) {
      const auto path = peer_checkpoint(ck.dir, t.rank(), t.world());
      t.restore(dt::io::load_checkpoint(path));
      std::printf("peer %d resumed from %s at step %lld\n", t.rank(), path.c_str(), static_cast<long long>(t.step()));
    }
    // Each peer saves its own state at the same steps; a DiLoCo round may be half done, which
    // restore() continues exactly (the global parameters and outer momentum are in the file).
    t.on_step([&t, &ck, save](const dt::train::step_metrics& m) {
      if (m.step % ck.save_every != 0 && m.step != t.options().steps) return;
      save(t, ck.dir);
      if (ck.keep) save(t, (fs::path(ck.dir) / ("step-" + std::to_string(m.step))).string());
    });
  };
  std::vector<dt::train::fit_result> results;
  int world = 1;
  if (mode == "in-process") {
    world = static_cast<int>(opt.integer("peers", 4));
    dt::detail::check(world >= 1 && world <= 256, "--peers must be in [1, 256], got ", world);
    const auto link = opt.text("link", "lan");
    opt.reject_unknown();
    std::printf("%d in-process peers over simulated '%s' links, %d thread(s) each\n", world, link.c_str(), static_cast<int>(threads));
    dt::transport::in_process net(dt::transport::links::preset(link, world, topts.seed), {topts.seed, std::chrono::minutes(10)});
    results = dt::train::fit_in_process<Trainer>(net, cfg, topts, data.dataset, comm, report, static_cast<int>(threads));
  } else {
#if DECENTRAIN_HAS_MPI
    std::optional<dt::transport::mpi_environment> mpi_env;  // outlives the endpoint and the trainer
#endif
    std::optional<dt::transport::any_endpoint> ep;
    if (mode == "tcp") {
      dt::transport::tcp_options o;
      o.listen = opt.text("listen", "");
      o.advertise = opt.text("advertise", "");
      o.join = split_list(opt.text("join", ""));
      o.rank = static_cast<int>(opt.integer("rank", 0));
      o.world = static_cast<int>(opt.integer("world", 1));
      o.join_timeout = std::chrono::milliseconds(opt.integer("join-timeout-ms", 60000));
      opt.reject_unknown();
      std::printf("tcp peer %d of %d listening on %s\n", o.rank, o.world, o.listen.c_str());
      std::fflush(stdout);
      ep.emplace(dt::transport::tcp::join(o));
    } else {
#if DECENTRAIN_HAS_MPI
      opt.text("mpi", "");
      opt.reject_unknown();
      mpi_env.emplace(nullptr, nullptr);
      ep.emplace(dt::transport::mpi());
#else
      dt::detail::fail("--mpi: this decentrain-gpt was built without MPI (install libopenmpi-dev and rebuild)");
#endif
    }
    world = ep->world();
#if defined(_OPENMP)
    omp_set_num_threads(static_cast<int>(threads));
#endif
    Trainer t(cfg, topts, *ep, comm);
    report(t);
    results.resize(static_cast<std::size_t>(world));
    results[static_cast<std::size_t>(t.rank())] = t.fit(data.dataset);
    if (t.rank() != 0) return 0;
    // Only this peer's own figures are known here; the table shows rank 0.
    results.resize(1);
  }

  // What a synchronous all-reduce of the gradient every step would have put on the wire per peer
  // (ring all-reduce: 2 (N-1)/N times the gradient's bytes), for comparison.
  const double grad_bytes = 4.0 * static_cast<double>(cfg.parameter_count());
  const double sync_bytes = world > 1 ? static_cast<double>(topts.steps) * 2.0 * (world - 1) / world * grad_bytes : 0.0;
  std::printf("\n%-6s %-10s %-14s %-14s %-12s %-12s\n", "peer", "val loss", "MB sent", "MB received", "net wait s", "clock s");
  for (std::size_t r = 0; r < results.size(); ++r) {
    const auto& m = results[r].last;
    std::printf("%-6zu %-10.4f %-14.2f %-14.2f %-12.2f %-12.2f\n", r, results[r].final_val_loss, static_cast<double>(m.bytes_sent) / 1e6,
                static_cast<double>(m.bytes_received) / 1e6, m.network_wait_s, m.clock_s);
  }
  const double sent = static_cast<double>(results[0].last.bytes_sent);
  std::printf("\ncomm %s: %.2f MB sent per peer; synchronous all-reduce every step would send %.2f MB (%.1fx more)\n",
              Comm::name, sent / 1e6, sync_bytes / 1e6, sent > 0 ? sync_bytes / sent : 0.0);
  std::printf("val loss %.4f\n", results[0].final_val_loss);
  return 0;
}

int cmd_train_peers(const options& opt) {
  peer_checkpointing ck;
  ck.dir = opt.text("checkpoint-dir", "");
  ck.resume = opt.has("resume");
  ck.keep = opt.has("keep-checkpoints");
  opt.text("resume", "");
  opt.text("keep-checkpoints", "");
  ck.save_every = opt.integer("save-every", 500);
  dt::detail::check(!ck.resume || !ck.dir.empty(), "--resume needs --checkpoint-dir");
  dt::detail::check(ck.save_every > 0, "--save-every must be positive");
  // The model shape and tokenizer come from the checkpoints when resuming; any peer's will do
  // (they share them), so a machine that holds only its own peer's file can resume.
  std::optional<dt::io::checkpoint> resumed;
  if (ck.resume) {
    std::vector<fs::path> found;
    if (fs::is_directory(ck.dir))
      for (const auto& e : fs::directory_iterator(ck.dir))
        if (e.path().filename().string().rfind("peer-", 0) == 0 && e.path().extension() == ".ckpt") found.push_back(e.path());
    dt::detail::check(!found.empty(), "--resume: no peer checkpoints (peer-R-of-W.ckpt) in ", ck.dir);
    std::sort(found.begin(), found.end());
    resumed = dt::io::load_checkpoint(found.front());
  }
  auto cfg = model_config(opt);
  auto data = load_training_data(opt, cfg.vocab_size, resumed ? &*resumed : nullptr);
  cfg.vocab_size = data.vocab_size;
  if (resumed) cfg = dt::train::config_of(*resumed);
  if (data.tokenizer) ck.alphabet = data.tokenizer->alphabet();

  dt::train::trainer_options t;
  t.steps = opt.integer("steps", 1000);
  t.batch_size = opt.integer("batch-size", 16);
  t.lr = opt.real("lr", 1e-3);
  t.min_lr = opt.real("min-lr", t.lr / 10);
  t.warmup_steps = opt.integer("warmup", t.steps / 20);
  t.beta2 = opt.real("beta2", 0.99);
  t.weight_decay = opt.real("weight-decay", 0.1);
  t.grad_clip = opt.real("grad-clip", 1.0);
  t.compute_dtype = compute_dtype(opt);
  t.seed = static_cast<std::uint64_t>(opt.integer("seed", 1337));
  t.eval_every = opt.integer("eval-every", 250);
  t.eval_batches = opt.integer("eval-batches", 20);
  t.collectives.link_bytes_in_flight = opt.real("link-in-flight", 0.0) * 1e6;
  dt::detail::check(t.collectives.link_bytes_in_flight >= 0, "--link-in-flight must be >= 0 (MB)");
  opt.text("metrics", "");
  const std::string comm = opt.text("comm", "diloco");
  const auto inner = opt.integer("inner-steps", 50);
  std::printf("model: %.2fM parameters; data: %s\n", static_cast<double>(cfg.parameter_count()) / 1e6, data.source.c_str());
  if (comm == "sync") return run_peers(opt, cfg, data, t, dt::comm::sync_allreduce{}, ck);
  if (comm == "local-sgd") {
    dt::comm::local_sgd<> p;
    p.inner_steps = inner;
    return run_peers(opt, cfg, data, t, p, ck);
  }
  if (comm == "diloco") {
    dt::comm::diloco<> p;
    p.inner_steps = inner;
    p.outer_optimizer.lr = opt.real("outer-lr", 0.7);
    p.outer_optimizer.momentum = opt.real("outer-momentum", 0.9);
    return run_peers(opt, cfg, data, t, p, ck);
  }
  dt::detail::fail("--comm must be sync, local-sgd or diloco, got '", comm, "'");
}

// ---- eval ----------------------------------------------------------------------------------

int cmd_eval(const options& opt) {
  set_threads(opt);
  const std::string weights = opt.text("weights", ""), shard = opt.text("tokens", ""), dump = opt.text("dump-grads", "");
  const auto n_head = opt.integer("n-head", 0);
  const auto B = opt.integer("batch-size", 4);
  auto T = opt.integer("block-size", 64);
  opt.reject_unknown();
  dt::detail::check(!weights.empty() && !shard.empty() && n_head > 0, "eval needs --weights, --tokens and --n-head");
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

int cmd_sample(const options& opt) {
  set_threads(opt);
  const std::string ckpt = opt.text("checkpoint", ""), weights = opt.text("weights", "");
  const auto n_head = opt.integer("n-head", 0);
  const std::string prompt = opt.text("prompt", ""), prompt_ids = opt.text("prompt-ids", "");
  const auto count = opt.integer("tokens", 200), top_k = opt.integer("top-k", 40);
  const double temperature = opt.real("temperature", 0.8);
  dt::rng gen(static_cast<std::uint64_t>(opt.integer("seed", 1337)), "sample");
  opt.reject_unknown();
  dt::detail::check(ckpt.empty() != weights.empty(), "sample needs exactly one of --checkpoint and --weights");
  dt::detail::check(temperature > 0 && count >= 0 && top_k >= 0, "--temperature must be > 0, --tokens and --top-k >= 0");

  std::optional<dt::nn::gpt<>> model;
  std::optional<dt::data::char_tokenizer> tok;
  dt::rng unused(0, "init");
  if (!ckpt.empty()) {
    const auto c = dt::io::load_checkpoint(ckpt);
    model.emplace(dt::train::config_of(c), unused);
    dt::optim::adamw<> ignored(model->parameters());
    dt::train::restore(c, *model, ignored);
    if (c.text.count("tokenizer.alphabet")) tok.emplace(c.text.at("tokenizer.alphabet"));
  } else {
    dt::detail::check(n_head > 0, "--weights needs --n-head");
    const auto file = dt::io::load_safetensors(weights);
    model.emplace(dt::train::gpt2_config(file, n_head), unused);
    dt::train::import_gpt2_weights(*model, file);
  }
  const auto& cfg = model->config();
  std::vector<std::int32_t> ids;
  if (!prompt_ids.empty()) {
    std::stringstream in(prompt_ids);
    for (std::string part; std::getline(in, part, ',');) ids.push_back(static_cast<std::int32_t>(std::stol(part)));
  } else if (!prompt.empty()) {
    dt::detail::check(tok.has_value(), "--prompt needs a checkpoint with a character tokenizer; use --prompt-ids");
    ids = tok->encode(prompt);
  }
  if (ids.empty()) ids.push_back(0);
  for (auto id : ids) dt::detail::check(id >= 0 && id < cfg.vocab_size, "prompt token ", id, " is outside the vocabulary of ", cfg.vocab_size);

  dt::no_grad guard;
  const std::size_t first_new = ids.size();
  for (std::int64_t i = 0; i < count; ++i) {
    const auto n = std::min<std::int64_t>(static_cast<std::int64_t>(ids.size()), cfg.block_size);
    std::vector<std::int32_t> ctx(ids.end() - n, ids.end());
    const auto last = model->logits(dt::from_vector(ctx, {1, n})).value().slice(1, n - 1, n).contiguous().reshape({cfg.vocab_size});
    auto logits = last.to_vector<double>();
    // Top-k, temperature, then a draw from the softmax.
    if (top_k > 0 && top_k < cfg.vocab_size) {
      const double cut = dt::math::top_k(last, top_k).first.to_vector<double>().back();
      for (auto& l : logits) if (l < cut) l = -INFINITY;
    }
    const double mx = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (auto& l : logits) total += (l = std::exp((l - mx) / temperature));
    double u = gen.uniform() * total;
    std::size_t pick = 0;
    while (pick + 1 < logits.size() && (u -= logits[pick]) > 0) ++pick;
    ids.push_back(static_cast<std::int32_t>(pick));
  }
  if (tok) {
    std::printf("%s\n", tok->decode(ids).c_str());
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
    if (command == "train") return cmd_train(options(argc, argv, 2, {"resume", "keep-checkpoints", "no-bias", "mpi"}));
    if (command == "eval") return cmd_eval(options(argc, argv, 2, {}));
    if (command == "sample") return cmd_sample(options(argc, argv, 2, {}));
    if (command == "help" || command == "--help" || command == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
    std::fprintf(stderr, "unknown command '%s'\n\n%s", command.c_str(), usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decentrain-gpt %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
