// bench/cpu_train_step: seconds per training step (forward, backward, AdamW) of our GPT-2 and
// of the same model in eager PyTorch (bench/torch_gpt.py, Debian's python3-torch), side by side
// in one run on the same threads. Each measurement runs in a process of its own so its peak
// memory (max RSS) is its own. Prints a table and writes JSON rows.
//
//   cpu_train_step [--threads N] [--steps S] [--json PATH] [--only shakespeare-char|gpt2-124m]
#include <decentrain/decentrain.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "output_file.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dt = decentrain;

namespace {

struct config {
  std::string preset;
  std::int64_t batch, block, vocab;
};

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// Child mode: time our training step for one configuration and print a JSON line.
int measure(const config& c, int steps) {
  auto cfg = dt::nn::gpt_preset(c.preset);
  cfg.vocab_size = c.vocab;
  cfg.dropout = 0.0;
  dt::rng init(1, "init"), data(2, "data");
  dt::nn::gpt<> model(cfg, init);
  dt::optim::adamw<> opt(model.parameters(), {1e-4, 0.9, 0.99, 1e-8, 0.1});
  std::vector<std::int32_t> x(static_cast<std::size_t>(c.batch * c.block)), y(x.size());
  for (auto& t : x) t = static_cast<std::int32_t>(data.below(static_cast<std::uint64_t>(c.vocab)));
  for (auto& t : y) t = static_cast<std::int32_t>(data.below(static_cast<std::uint64_t>(c.vocab)));
  const auto xs = dt::from_vector(x, {c.batch, c.block}), ys = dt::from_vector(y, {c.batch, c.block});
  std::vector<double> times;
  for (int i = 0; i <= steps; ++i) {  // the first step warms up and is not timed
    const auto t0 = std::chrono::steady_clock::now();
    auto loss = model.loss(xs, ys);
    model.parameters().zero_grad();
    loss.backward();
    opt.step();
    if (i) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  std::printf("{\"impl\": \"decentrain\", \"seconds_per_step\": %.6f, \"peak_rss_mb\": %.1f, \"parameters\": %lld}\n",
              times[times.size() / 2], peak_rss_mb(), static_cast<long long>(cfg.parameter_count()));
  return 0;
}

// Runs a command and parses the JSON object on its last output line.
dt::io::json_value run_json(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  dt::detail::check(pipe != nullptr, "cannot run ", command);
  std::string output, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = ::pclose(pipe);
  dt::detail::check(status == 0, "`", command, "` failed (status ", status, "):\n", output);
  std::size_t end = output.find_last_not_of("\n");
  std::size_t start = output.rfind('\n', end);
  last = output.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  return dt::io::parse_json(last);
}

double number(const dt::io::json_value& v, const std::string& key) { return std::stod(v.at(key).text); }

}  // namespace

int main(int argc, char** argv) try {
  int threads = 2, steps = 5;
  std::string json_path = "cpu_train_step.json", only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::atoi(argv[i + 1]);
    else if (flag == "--json") json_path = argv[i + 1];
    else if (flag == "--only") only = argv[i + 1];
    else if (flag == "--measure") {  // internal: --measure PRESET BATCH BLOCK VOCAB STEPS
      dt::detail::check(i + 5 < argc, "--measure needs PRESET BATCH BLOCK VOCAB STEPS");
      return measure({argv[i + 1], std::atoll(argv[i + 2]), std::atoll(argv[i + 3]), std::atoll(argv[i + 4])}, std::atoi(argv[i + 5]));
    } else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  bench::output_file json(json_path);  // opened first: a bad path fails before the minutes of measuring
  const std::vector<config> configs = {{"shakespeare-char", 8, 256, 65}, {"gpt2-124m", 4, 64, 50257}};
  const std::string self = argv[0];
  const std::string env = "OMP_NUM_THREADS=" + std::to_string(threads) + " ";
  std::printf("training step (forward + backward + AdamW), f32, %d threads, median of %d steps\n", threads, steps);
  std::printf("%-18s %6s %11s %11s %8s %10s %10s %9s %9s\n", "model", "B x T", "ours s", "torch s", "speedup",
              "ours GF/s", "torch GF/s", "ours MB", "torch MB");
  json << "[\n";
  bool first = true;
  for (const auto& c : configs) {
    if (!only.empty() && only != c.preset) continue;
    const auto ours = run_json(env + "'" + self + "' --measure " + c.preset + " " + std::to_string(c.batch) + " " +
                               std::to_string(c.block) + " " + std::to_string(c.vocab) + " " + std::to_string(steps));
    const auto torch = run_json("/usr/bin/python3 " DECENTRAIN_SOURCE_DIR "/bench/torch_gpt.py step --preset " + c.preset +
                                " --batch " + std::to_string(c.batch) + " --block " + std::to_string(c.block) +
                                " --threads " + std::to_string(threads) + " --steps " + std::to_string(steps));
    auto cfg = dt::nn::gpt_preset(c.preset);
    cfg.vocab_size = c.vocab;
    // nanoGPT's estimate: 6 N per token (N without position embeddings) + 12 L C T for attention.
    const double n = static_cast<double>(cfg.parameter_count() - cfg.block_size * cfg.n_embd);
    const double flops = (6.0 * n + 12.0 * static_cast<double>(cfg.n_layer * cfg.n_embd * c.block)) *
                         static_cast<double>(c.batch * c.block);
    const double so = number(ours, "seconds_per_step"), st = number(torch, "seconds_per_step");
    const double mo = number(ours, "peak_rss_mb"), mt = number(torch, "peak_rss_mb");
    std::printf("%-18s %3lldx%-3lld %11.3f %11.3f %7.2fx %10.1f %10.1f %9.0f %9.0f\n", c.preset.c_str(),
                static_cast<long long>(c.batch), static_cast<long long>(c.block), so, st, st / so, flops / so / 1e9,
                flops / st / 1e9, mo, mt);
    json << (first ? "" : ",\n") << "  {\"model\": \"" << c.preset << "\", \"batch\": " << c.batch << ", \"block\": " << c.block
         << ", \"threads\": " << threads << ", \"ours_seconds\": " << so << ", \"torch_seconds\": " << st
         << ", \"speedup\": " << st / so << ", \"ours_gflops\": " << flops / so / 1e9 << ", \"torch_gflops\": "
         << flops / st / 1e9 << ", \"ours_peak_mb\": " << mo << ", \"torch_peak_mb\": " << mt << ", \"torch\": \""
         << torch.at("torch").text << "\"}";
    first = false;
  }
  json << "\n]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cpu_train_step: %s\n", e.what());
  return 1;
}
