// Pipeline schedules and stages. (1) On the simulator (parallel/schedule/simulate.hpp), each
// action one unit (a forward, a backward's input half, its weight half): the bubble each schedule
// leaves against the closed form of its paper (ZB-V's: the least any schedule can leave), the
// activations a peer holds at most, and each step against 1F1B's. (2) What each stage of GPT-2
// 124M and the shakespeare-char model holds (nn::gpt cut by nn::part), against the whole model,
// and the peak memory of a training step per stage under 1F1B against the whole model's and under
// ZB-H1 against 1F1B's (real compute; ZB-H1's input halves keep what their weight halves need).
// (3) ZB-H1 and ZB-V against 1F1B, and (4) the cost
// partitioner's cut (parallel/partition.hpp) against the even cut, on the simulator fed with
// GPT-2 124M's forward, input-gradient and weight-gradient times measured here (a block, and the
// end stages' extra work). (5) The placement of 4 stages x 4 copies on 16 peers searched from the
// links (parallel/link_placement.hpp) against random placements, on the `heterogeneous` links.
// (6) A morph after losing a quarter of 8 peers (fault::elastic, real compute): from the kill to
// training again, and the state moved.
// Usage: bench_pipeline [--json PATH] [--no-measure | --morph-only]
#include <decentrain/decentrain.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "output_file.hpp"

namespace dt = decentrain;
namespace ps = decentrain::parallel::schedule;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A stage of `cfg` cut into one block per stage (`part`): the median of `reps` timings of its
// forward on a micro-batch of (rows, T), its backward's input half (the backward with the linear
// layers' weight gradients put off, autograd/deferred.hpp) and its weight half (running them),
// as the pipeline's executor runs them.
struct measured {
  double forward = 0, input = 0, weight = 0;
  double total() const { return forward + input + weight; }
  measured minus(const measured& o) const {
    return {std::max(0.0, forward - o.forward), std::max(0.0, input - o.input), std::max(0.0, weight - o.weight)};
  }
};
measured measure_stage(const dt::nn::gpt_config& cfg, const dt::nn::part& part, std::int64_t rows, std::int64_t T, int reps) {
  dt::rng init(1, "init");
  dt::nn::gpt<dt::cpu> stage(cfg, init, part);
  dt::rng gen(2, "stream");
  const auto stream = dt::randn<dt::cpu>(dt::shape{rows, T, cfg.n_embd}, gen);
  const auto ids = dt::zeros<dt::cpu>(dt::shape{rows, T}, dt::dtype::i32);
  std::vector<double> f, input, weight;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    stage.parameters().zero_grad();
    dt::var<dt::cpu> in(stream, true);
    auto t0 = std::chrono::steady_clock::now();
    auto out = stage.stage_forward(part.stage, part.first() ? dt::var<dt::cpu>() : in, ids, ids, nullptr);
    const double fwd = seconds_since(t0);
    const auto g = dt::ones<dt::cpu>(out.shape());
    dt::weight_gradients later;
    t0 = std::chrono::steady_clock::now();
    {
      dt::defer_weight_gradients scope(later);
      out.backward(g);
    }
    const double in_half = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    later.run();
    const double w_half = seconds_since(t0);
    if (r == 0) continue;
    f.push_back(fwd);
    input.push_back(in_half);
    weight.push_back(w_half);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(f), median(input), median(weight)};
}

// Peak host memory (the allocator's high-water mark over live tensors, as PyTorch's
// max_memory_allocated) of one training step of stage `s` of `stages` under `schedule` (1f1b or
// zb-h1, whose input halves keep their weight halves' inputs until these run) with `micro`
// micro-batches of (rows, T): the part, its gradients, AdamW's state and the activations it
// holds, with the other stages stood in for by random streams and gradients. `stages` 1: the
// whole model taking the micro-batches' rows at once, as one peer would.
std::size_t stage_peak_bytes(const dt::nn::gpt_config& cfg, int s, int stages, int micro, std::int64_t rows, std::int64_t T,
                             const char* schedule = "1f1b") {
  using memory = dt::memory<dt::cpu>;
  const auto before = memory::allocated_bytes();
  memory::reset_peak();
  {
    dt::rng init(1, "init"), gen(2, "stream");
    const dt::nn::part part{s, stages, {}};
    dt::nn::gpt<dt::cpu> stage(cfg, init, part);
    dt::optim::adamw<dt::cpu> opt(stage.parameters());
    const auto ids = [&](std::int64_t r) { return dt::zeros<dt::cpu>(dt::shape{r, T}, dt::dtype::i32); };
    if (stages == 1) {
      stage.loss(ids(rows * micro), ids(rows * micro)).backward();
    } else {
      const auto program = ps::by_name(schedule, stages, micro);
      std::map<int, std::pair<dt::var<dt::cpu>, dt::var<dt::cpu>>> held;  // micro -> (in, out)
      std::map<int, dt::weight_gradients> owed;  // micro -> its weight half
      for (const auto& a : program.actions[static_cast<std::size_t>(s)]) {
        if (a.what == ps::op::backward_weight) {
          owed.at(a.micro).run();
          owed.erase(a.micro);
          continue;
        }
        if (a.what == ps::op::forward) {
          dt::var<dt::cpu> in;
          if (s > 0) in = dt::var<dt::cpu>(dt::randn<dt::cpu>(dt::shape{rows, T, cfg.n_embd}, gen), true);
          auto out = stage.stage_forward(s, in, ids(rows), ids(rows));
          held[a.micro] = {std::move(in), std::move(out)};
          continue;
        }
        auto [in, out] = std::move(held.at(a.micro));
        held.erase(a.micro);
        const auto g = s == stages - 1 ? dt::ones<dt::cpu>(out.shape()) : dt::randn<dt::cpu>(out.shape(), gen);
        if (a.what == ps::op::backward_input) {
          dt::defer_weight_gradients scope(owed[a.micro]);
          out.backward(g);
        } else {
          out.backward(g);
        }
      }
    }
    opt.step();
  }
  return memory::peak_allocated_bytes() - before;
}

// (6) A morph. S x R in-process peers train `cfg` (real compute, 2 micro-batches of `rows` rows a
// copy) under fault::elastic with sync averaging; after step 2 the `victims` are killed, and the
// peers left re-form in the shape the pipeline's morph picks, each taking its new part from those
// that hold it (the trainer's redeals()). Figures: a step before the loss and after it (the median over
// the peers), from the kill to the first step finished after it (which redoes the step the loss
// broke), the re-deal itself (the slowest peer), and the state moved (all peers).
struct morph_figures {
  int stages_after = 0, copies_after = 0, views = 0;
  double step_before_s = 0, step_after_s = 0, back_s = 0, redeal_s = 0, moved_mb = 0;
};
morph_figures measure_morph(const dt::nn::gpt_config& cfg, int S, int R, const std::vector<int>& victims, std::int64_t rows,
                            std::int64_t T) {
  using trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::pipeline<>, dt::fault::elastic>;
  using clock = std::chrono::steady_clock;
  static const auto data = [] {
    const auto text = dt::data::builtin_corpus(std::size_t{1} << 20, 1);
    return dt::data::token_dataset(dt::data::char_tokenizer::from_text(text).encode(text));
  }();
  const int world = S * R;
  const std::int64_t kill_after = 2, steps = 5;
  dt::train::trainer_options o;
  o.steps = steps;
  o.batch_size = rows;
  o.block_size = T;
  o.eval_batches = 1;
  o.eval_every = 0;
  dt::parallel::pipeline<> pipe;
  pipe.stages = S;
  pipe.micro_batches = 2;
  dt::fault::elastic fault;
  fault.agreement.timeout = std::chrono::seconds(600);
  dt::transport::in_process::options net_options;
  net_options.recv_timeout = std::chrono::seconds(1200);
  net_options.peers_fail_alone = true;
  dt::transport::in_process net(dt::transport::links::ideal(world), net_options);
  std::mutex m;
  clock::time_point killed_at{};
  std::vector<std::map<std::int64_t, clock::time_point>> done(static_cast<std::size_t>(world));
  std::vector<std::vector<trainer::redeal_record>> redeals(static_cast<std::size_t>(world));
  std::vector<int> shape(static_cast<std::size_t>(world), 0), views(shape);
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  net.run([&](dt::transport::in_process::endpoint& ep) {
    const int r = ep.rank();
    const bool victim = std::find(victims.begin(), victims.end(), r) != victims.end();
    trainer t(cfg, o, ep, {}, pipe, fault);
    t.on_step([&](const dt::train::step_metrics& s) {
      std::lock_guard lock(m);
      done[static_cast<std::size_t>(r)][s.step] = clock::now();
      if (victim && s.step == kill_after) {
        killed_at = clock::now();
        net.kill(r);
        dt::detail::fail("killed");
      }
    });
    try {
      (void)t.fit(data);
      std::lock_guard lock(m);
      redeals[static_cast<std::size_t>(r)] = t.redeals();
      shape[static_cast<std::size_t>(r)] = t.placement().stages;
      views[static_cast<std::size_t>(r)] = static_cast<int>(t.fault().change_count());
    } catch (const std::exception& e) {
      std::lock_guard lock(m);
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  morph_figures f;
  std::vector<double> before, after;
  double back = 1e300;
  for (int r = 0; r < world; ++r) {
    const auto i = static_cast<std::size_t>(r);
    if (std::find(victims.begin(), victims.end(), r) != victims.end()) continue;
    if (!errors[i].empty()) dt::detail::fail("morph bench: peer ", r, ": ", errors[i]);
    const auto& d = done[i];
    before.push_back(std::chrono::duration<double>(d.at(kill_after) - d.at(kill_after - 1)).count());
    after.push_back(std::chrono::duration<double>(d.at(kill_after + 2) - d.at(kill_after + 1)).count());
    back = std::min(back, std::chrono::duration<double>(d.at(kill_after + 1) - killed_at).count());
    for (const auto& rd : redeals[i]) {
      f.redeal_s = std::max(f.redeal_s, rd.seconds);
      f.moved_mb += static_cast<double>(rd.bytes_received) / 1e6;
    }
    f.stages_after = shape[i];
    f.copies_after = (world - static_cast<int>(victims.size())) / shape[i];
    f.views = views[i];
  }
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  f.step_before_s = before[before.size() / 2];
  f.step_after_s = after[after.size() / 2];
  f.back_s = back;
  return f;
}

std::int64_t parameter_count(const dt::parameter_list<dt::cpu>& params) {
  std::int64_t n = 0;
  for (const auto& e : params) n += e.param.value().numel();
  return n;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string json = "bench/results/pipeline.json";
  bool measure = true, morph = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--no-measure") {
      measure = morph = false;
    } else if (a == "--morph-only") {
      measure = false;
    } else {
      std::fprintf(stderr, "usage: bench_pipeline [--json PATH] [--no-measure | --morph-only]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  bench::output_file out(json);
  out << "[\n";
  bool first = true, all_equal = true;
  std::printf("%-7s %3s %4s %10s %12s %6s %13s %10s\n", "sched", "S", "M", "bubble", "closed form", "equal", "most held",
              "vs 1F1B");
  for (int S : {2, 4, 8})
    for (int M : {S, 2 * S, 4 * S, 8 * S}) {
      const auto base = ps::simulate(ps::one_f_one_b(S, M)).makespan;
      struct row {
        const char* name;
        ps::program p;
        int num, den;
        int chunks = 1;  // a chunk's action is 1 / chunks of a stage's: its makespan counts so much less
      };
      for (const auto& r : {row{"gpipe", ps::gpipe(S, M), S - 1, M + S - 1}, row{"1f1b", ps::one_f_one_b(S, M), S - 1, M + S - 1},
                            row{"zb-h1", ps::zb_h1(S, M), S - 1, 3 * M + S - 1},
                            // ZB-V: 6M + S - 1 chunk actions (the least) from M = 3S/2 on, 4M + 4S - 2 below
                            2 * M >= 3 * S ? row{"zb-v", ps::zb_v(S, M), S - 1, 6 * M + S - 1, 2}
                                           : row{"zb-v", ps::zb_v(S, M), 2 * S - 1 - M, 2 * M + 2 * S - 1, 2},
                            row{"int:v=2", ps::interleaved(S, M, 2), S - 1, 2 * M + S - 1, 2}}) {
        const auto t = ps::simulate(r.p);
        const double closed = static_cast<double>(r.num) / r.den;
        const bool equal = t.idle() * r.den == r.num * t.makespan * static_cast<std::int64_t>(t.busy.size());
        all_equal = all_equal && equal;
        const double speedup = static_cast<double>(base) * r.chunks / static_cast<double>(t.makespan);
        // The most activations a peer held, in stages' worth (a chunk's are 1 / chunks of a stage's).
        const double most = static_cast<double>(*std::max_element(t.peak_stash.begin(), t.peak_stash.end())) / r.chunks;
        std::printf("%-7s %3d %4d %10.4f %12.4f %6s %13.1f %9.3fx\n", r.name, S, M, t.bubble(), closed, equal ? "yes" : "NO",
                    most, speedup);
        out << (first ? "" : ",\n") << "  {\"schedule\": \"" << r.name << "\", \"stages\": " << S << ", \"micro_batches\": " << M
            << ", \"bubble\": " << t.bubble() << ", \"closed_form\": " << closed << ", \"equal\": " << (equal ? "true" : "false")
            << ", \"stage0_peak_stash\": " << t.peak_stash[0] << ", \"most_held_stages\": " << most << ", \"makespan\": " << t.makespan << ", \"speedup_vs_1f1b\": " << speedup
            << "}";
        first = false;
      }
    }

  // (2b) Peak memory of a training step, per stage under 1F1B against the whole model, real compute.
  if (measure) {
    std::printf("\n%-18s %3s %4s %6s %14s %10s %14s %12s\n", "model", "S", "M", "stage", "1f1b peak MB", "of whole",
                "zb-h1 peak MB", "zb-h1/1f1b");
    for (const char* preset : {"shakespeare-char", "gpt2-124m"}) {
      auto cfg = dt::nn::gpt_preset(preset);
      const bool big = cfg.n_layer == 12;
      const std::int64_t rows = big ? 1 : 4, T = big ? 256 : cfg.block_size;
      for (int S : {2, 4}) {
        const int M = 2 * S;
        const auto whole = stage_peak_bytes(cfg, 0, 1, M, rows, T);
        std::printf("%-18s %3d %4d %6s %14.1f %9.3fx\n", preset, 1, M, "all", whole / 1e6, 1.0);
        out << ",\n  {\"peak\": true, \"model\": \"" << preset << "\", \"stages\": 1, \"micro_batches\": " << M
            << ", \"rows\": " << rows << ", \"T\": " << T << ", \"peak_bytes\": " << whole << "}";
        for (int s = 0; s < S; ++s) {
          const auto peak = stage_peak_bytes(cfg, s, S, M, rows, T);
          const auto zb = stage_peak_bytes(cfg, s, S, M, rows, T, "zb-h1");
          std::printf("%-18s %3d %4d %6d %14.1f %9.3fx %14.1f %11.3fx\n", preset, S, M, s, peak / 1e6,
                      static_cast<double>(peak) / whole, zb / 1e6, static_cast<double>(zb) / peak);
          out << ",\n  {\"peak\": true, \"model\": \"" << preset << "\", \"stages\": " << S << ", \"stage\": " << s
              << ", \"micro_batches\": " << M << ", \"peak_bytes\": " << peak << ", \"of_whole\": " << static_cast<double>(peak) / whole
              << ", \"zb_h1_peak_bytes\": " << zb << "}";
        }
      }
    }
  }

  // (2) What a stage holds: parameters (and with AdamW's two moments, 3x their bytes in f32).
  std::printf("\n%-18s %3s %6s %14s %14s %10s\n", "model", "S", "stage", "parameters", "MB w/ AdamW", "of whole");
  for (const char* preset : {"shakespeare-char", "gpt2-124m"}) {
    auto cfg = dt::nn::gpt_preset(preset);
    dt::rng init_whole(1, "init");
    const auto whole = parameter_count(dt::nn::gpt<dt::cpu>(cfg, init_whole).parameters());
    std::printf("%-18s %3d %6s %14lld %14.1f %9.3fx\n", preset, 1, "all", static_cast<long long>(whole), 12.0 * whole / 1e6, 1.0);
    out << ",\n  {\"model\": \"" << preset << "\", \"stages\": 1, \"parameters\": " << whole << "}";
    for (int S : {2, 4}) {
      for (int s = 0; s < S; ++s) {
        dt::rng init(1, "init");
        const auto n = parameter_count(dt::nn::gpt<dt::cpu>(cfg, init, dt::nn::part{s, S, {}}).parameters());
        std::printf("%-18s %3d %6d %14lld %14.1f %9.3fx\n", preset, S, s, static_cast<long long>(n), 12.0 * n / 1e6,
                    static_cast<double>(n) / whole);
        out << ",\n  {\"model\": \"" << preset << "\", \"stages\": " << S << ", \"stage\": " << s << ", \"parameters\": " << n
            << ", \"of_whole\": " << static_cast<double>(n) / whole << "}";
      }
    }
  }

  // (3) and (4): the simulator fed with GPT-2 124M's measured costs, a micro-batch of 1 x 256
  // tokens: a middle block, and the end stages' extra work (embeddings; final norm, head and loss)
  // as the difference between an end stage of one block and a middle one.
  if (measure) {
    const auto cfg = dt::nn::gpt_preset("gpt2-124m");
    const std::int64_t rows = 1, T = 256;
    const int L = static_cast<int>(cfg.n_layer);
    const auto block = measure_stage(cfg, {1, L, {}}, rows, T, 5);
    const auto first = measure_stage(cfg, {0, L, {}}, rows, T, 5).minus(block);
    const auto last = measure_stage(cfg, {L - 1, L, {}}, rows, T, 5).minus(block);
    std::printf("\nGPT-2 124M, micro-batch %lld x %lld (ms)   forward  input grad  weight grad\n", static_cast<long long>(rows),
                static_cast<long long>(T));
    for (const auto& [what, m] : {std::pair{"a block", block}, std::pair{"first stage extra", first}, std::pair{"last stage extra", last}})
      std::printf("  %-36s %8.1f %11.1f %12.1f\n", what, 1e3 * m.forward, 1e3 * m.input, 1e3 * m.weight);
    out << ",\n  {\"measured_ms\": {\"block\": [" << 1e3 * block.forward << ", " << 1e3 * block.input << ", " << 1e3 * block.weight
        << "], \"first_extra\": [" << 1e3 * first.forward << ", " << 1e3 * first.input << ", " << 1e3 * first.weight
        << "], \"last_extra\": [" << 1e3 * last.forward << ", " << 1e3 * last.input << ", " << 1e3 * last.weight << "]}}";
    // Per-stage costs of a cut, in units of 0.1 ms.
    const auto costs_of = [&](const std::vector<std::int64_t>& cut) {
      std::vector<ps::costs> out_costs;
      const auto units = [](double sec) { return static_cast<std::int64_t>(sec * 1e4 + 0.5); };
      for (std::size_t s = 0; s < cut.size(); ++s) {
        auto m = measured{block.forward * cut[s], block.input * cut[s], block.weight * cut[s]};
        for (const auto* extra : {s == 0 ? &first : nullptr, s + 1 == cut.size() ? &last : nullptr})
          if (extra) m = {m.forward + extra->forward, m.input + extra->input, m.weight + extra->weight};
        out_costs.push_back({.forward = units(m.forward), .backward_input = units(m.input), .backward_weight = units(m.weight)});
      }
      return out_costs;
    };
    std::printf("\n%3s %4s %-16s %12s %12s %12s %10s %10s %10s %16s %12s %10s %12s\n", "S", "M", "cut", "1f1b ms", "zb-h1 ms",
                "gpipe ms", "zb vs 1f1b", "zb-v ms", "vs 1f1b", "partitioned cut", "1f1b ms", "vs even", "its zb-h1");
    for (int S : {2, 4}) {
      const std::vector<std::int64_t> even(static_cast<std::size_t>(S), L / S);
      dt::parallel::model_costs mc;
      mc.blocks.assign(static_cast<std::size_t>(L), block.total());
      mc.first_extra = first.total();
      mc.last_extra = last.total();
      const auto cut = dt::parallel::partition(mc, S);
      const auto show = [](const std::vector<std::int64_t>& k) {
        std::string t;
        for (const auto b : k) {
          if (!t.empty()) t += '/';
          t += std::to_string(b);
        }
        return t;
      };
      for (int M : {S, 2 * S, 4 * S, 8 * S}) {
        const double f1b = 0.1 * static_cast<double>(ps::simulate(ps::one_f_one_b(S, M), costs_of(even)).makespan);
        const double zb = 0.1 * static_cast<double>(ps::simulate(ps::zb_h1(S, M), costs_of(even)).makespan);
        const double gp = 0.1 * static_cast<double>(ps::simulate(ps::gpipe(S, M), costs_of(even)).makespan);
        const double cut_f1b = 0.1 * static_cast<double>(ps::simulate(ps::one_f_one_b(S, M), costs_of(cut)).makespan);
        const double cut_zb = 0.1 * static_cast<double>(ps::simulate(ps::zb_h1(S, M), costs_of(cut)).makespan);
        // ZB-V: the blocks cut evenly into 2S model stages (the earlier ones taking one more), the
        // first peer holding the embeddings and the head.
        const auto v_cut = dt::nn::part{0, S, {}, 2}.blocks_per_stage(L);
        const double zbv = 0.1 * static_cast<double>(ps::simulate(ps::zb_v(S, M), costs_of(v_cut)).makespan);
        std::printf("%3d %4d %-16s %12.1f %12.1f %12.1f %9.3fx %10.1f %9.3fx %16s %12.1f %9.3fx %11.3fx\n", S, M, show(even).c_str(),
                    f1b, zb, gp, f1b / zb, zbv, f1b / zbv, show(cut).c_str(), cut_f1b, cut_f1b / f1b, cut_f1b / cut_zb);
        out << ",\n  {\"measured\": true, \"stages\": " << S << ", \"micro_batches\": " << M << ", \"one_f_one_b_ms\": " << f1b
            << ", \"zb_h1_ms\": " << zb << ", \"gpipe_ms\": " << gp << ", \"zb_h1_speedup\": " << f1b / zb
            << ", \"zb_v_ms\": " << zbv << ", \"zb_v_speedup\": " << f1b / zbv
            << ", \"partitioned_cut\": \"" << show(cut) << "\", \"partitioned_one_f_one_b_ms\": " << cut_f1b
            << ", \"partitioned_vs_even\": " << cut_f1b / f1b << ", \"partitioned_zb_h1_speedup\": " << cut_f1b / cut_zb << "}";
      }
    }

    // (5) Placement by links (parallel/link_placement.hpp): 16 peers on the `heterogeneous` links
    // (each peer its own uplink, 10 Mbit/s to 1 Gbit/s, and latency), GPT-2 124M in 4 stages x 4
    // copies under 1F1B, 8 micro-batches of 1 x 256 a step, f32 activations; each stage's copies
    // average its parameters every step (sync) or every 50 steps (DiLoCo H = 50, its bytes spread
    // over the 50). The searched placement's step against rank order and the mean of 100 random
    // placements, on the cost model (the measured compute, each hop on its own link).
    std::printf("\n%-10s %5s %12s %12s %12s %12s %10s %10s\n", "traffic", "seed", "placed s", "rank-order s", "random s",
                "best random", "vs random", "vs order");
    const int S = 4, R = 4, M = 8;
    const auto cut = dt::nn::part{0, S, {}}.blocks_per_stage(L);
    dt::parallel::pipeline_traffic traffic;
    traffic.micro_batches = M;
    traffic.activation_bytes = static_cast<double>(rows * T * cfg.n_embd) * 4.0;
    for (std::size_t st = 0; st < cut.size(); ++st) {
      auto m = measured{block.forward * cut[st], block.input * cut[st], block.weight * cut[st]};
      for (const auto* extra : {st == 0 ? &first : nullptr, st + 1 == cut.size() ? &last : nullptr})
        if (extra) m = {m.forward + extra->forward, m.input + extra->input, m.weight + extra->weight};
      const auto us = [](double sec) { return static_cast<std::int64_t>(sec * 1e6 + 0.5); };
      traffic.compute.push_back({.forward = us(m.forward), .backward_input = us(m.input), .backward_weight = us(m.weight)});
    }
    std::vector<double> stage_bytes;
    for (int st = 0; st < S; ++st) {
      dt::rng init(1, "init");
      stage_bytes.push_back(4.0 * static_cast<double>(parameter_count(dt::nn::gpt<dt::cpu>(cfg, init, dt::nn::part{st, S, {}}).parameters())));
    }
    for (const auto& [label, every] : {std::pair{"sync", 1.0}, std::pair{"diloco:50", 50.0}}) {
      traffic.parameter_bytes.clear();
      for (const double b : stage_bytes) traffic.parameter_bytes.push_back(b / every);
      for (const std::uint64_t seed : {1, 2, 3}) {
        const auto sim = dt::transport::links::heterogeneous(S * R, seed);
        dt::parallel::link_table links(S * R);
        for (int a = 0; a < S * R; ++a)
          for (int b = 0; b < S * R; ++b) links.at(a, b) = {sim.at(a, b).latency_s, sim.bandwidth(a, b)};
        const auto placed = dt::parallel::place_by_links(links, traffic, S, seed, 8);
        const double mine = dt::parallel::step_seconds(placed, links, traffic);
        const double order = dt::parallel::step_seconds(dt::parallel::rank_order(S, R), links, traffic);
        std::mt19937_64 gen(seed + 100);
        double sum = 0, best_random = 1e300;
        for (int i = 0; i < 100; ++i) {
          const double r = dt::parallel::step_seconds(dt::parallel::random_grid(S, R, gen), links, traffic);
          sum += r;
          best_random = std::min(best_random, r);
        }
        const double random = sum / 100;
        std::printf("%-10s %5llu %12.2f %12.2f %12.2f %12.2f %9.3fx %9.3fx\n", label, static_cast<unsigned long long>(seed), mine,
                    order, random, best_random, mine / random, mine / order);
        out << ",\n  {\"placement\": true, \"traffic\": \"" << label << "\", \"seed\": " << seed << ", \"placed_s\": " << mine
            << ", \"rank_order_s\": " << order << ", \"random_mean_s\": " << random << ", \"random_best_s\": " << best_random
            << ", \"placed_vs_random\": " << mine / random << "}";
      }
    }
  }
  if (morph) {
    std::printf("\n%-18s %-9s %-8s %-9s %6s %12s %12s %14s %10s %10s\n", "model", "before", "lost", "after", "views", "step before s",
                "step after s", "kill to step s", "redeal s", "moved MB");
    for (const char* preset : {"shakespeare-char", "gpt2-124m"}) {
      const auto cfg = dt::nn::gpt_preset(preset);
      const bool big = cfg.n_layer == 12;
      struct plan {
        int S, R;
        std::vector<int> victims;
      };
      // A quarter of 8 peers: two of stage 0 (2 x 4: the shape holds, parts move to refill the
      // copies), or one copy's last two stages (4 x 2: six peers make no copies of 4 stages, the
      // model is cut anew).
      for (const auto& [S, R, victims] : {plan{2, 4, {0, 2}}, plan{4, 2, {6, 7}}}) {
        const auto f = measure_morph(cfg, S, R, victims, 2, big ? 64 : 128);
        const auto lost = dt::detail::concat(victims[0], ",", victims[1]);
        std::printf("%-18s %dx%-7d %-8s %dx%-7d %6d %12.2f %12.2f %14.2f %10.2f %10.1f\n", preset, S, R, lost.c_str(), f.stages_after,
                    f.copies_after, f.views, f.step_before_s, f.step_after_s, f.back_s, f.redeal_s, f.moved_mb);
        out << (first ? "" : ",\n") << "  {\"morph\": true, \"model\": \"" << preset << "\", \"stages\": " << S << ", \"copies\": " << R
            << ", \"lost\": \"" << lost << "\", \"stages_after\": " << f.stages_after << ", \"copies_after\": " << f.copies_after
            << ", \"views\": " << f.views << ", \"step_before_s\": " << f.step_before_s << ", \"step_after_s\": " << f.step_after_s
            << ", \"kill_to_step_s\": " << f.back_s << ", \"redeal_s\": " << f.redeal_s << ", \"moved_mb\": " << f.moved_mb << "}";
        first = false;
      }
    }
  }
  out << "\n]\n";
  out.close();
  std::printf("rows written to %s\n", json.c_str());
  return all_equal ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
  return 2;
}
