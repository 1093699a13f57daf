// bench/heterogeneous: peers of different speeds, equal work against work sized to speed. 8
// in-process peers (--peers) of speeds 1x to 4x (transport::speeds::spread: log-spaced, dealt by
// the seed) train nanoGPT's CPU-recipe model on tinyshakespeare over simulated `heterogeneous`
// links (--link), each inner step charged --step-seconds / speed of simulated time (the
// deterministic simulator). Rows (--only, ',' between names):
//   sync                  synchronous all-reduce every step, equal batches
//   sync-target           sync with a target batch of peers x batch rows a step (the same rows as
//                         sync's), each peer adding up micro-batches of batch / --micro-batches rows
//                         (each charged that share of an inner step), as many as its speed makes
//                         its share (sized after step 0, then every 10 steps)
//   diloco-equal          DiLoCo, every peer H inner steps a round
//   diloco-sized          DiLoCo with sized_to_speed: H_i = H s_slowest / s_i, sized after step 0
//   diloco-homogeneous    DiLoCo on 8 peers all at the speeds' mean, for as many steps as give the
//                         tokens diloco-sized trained (run after it): the time the same compute
//                         needs on identical peers
//   sync-homogeneous      sync on peers at the mean speed, the same steps (sync's reference)
//   diloco-auto           DiLoCo tuned (comm/auto_tuning.hpp, the command line's --auto): H and
//                         the codec (identity, int8, int4) picked from the probed links and the
//                         slowest peer's compute after step 0, picked again on drift; sized to speed
//   diloco-auto-homogeneous  the same, tuned, on peers at the mean speed for as many steps as give
//                         the tokens diloco-auto trained (run after it)
//   streaming-equal       Streaming DiLoCo (--fragments, --overlap, --codec), every peer one inner
//                         step a step
//   streaming-sized       the same with sized_to_speed: each step as many inner steps as fit in
//                         the slowest peer's one, each fragment's average weighed by rows
//   streaming-homogeneous the same policy unsized on peers at the mean speed for as many steps as
//                         give the tokens streaming-sized trained (run after it)
//   streaming-auto        Streaming DiLoCo tuned (the command line's --auto --sized-to-speed): H,
//                         the fragments, the overlap and the codec (identity, int8, int4) picked
//                         once the links probed beside the first steps are in, picked again on
//                         drift; sized to speed (--inner-steps, --fragments, --overlap until the pick)
//   streaming-auto-homogeneous  the same tuned policy unsized on peers at the mean speed for as
//                         many steps as give the tokens streaming-auto trained (run after it)
// The streaming rows are timed, not deterministic: their exchanges run on lanes beside the
// compute, which the deterministic simulator does not offer. Each peer's compute is its thread's
// CPU time, its speed scaled so that an inner step at speed 1 moves its clock --step-seconds (one
// step measured first).
// Columns: the compute utilisation (compute over clock) of the slowest and of the fastest peer
// (and, in the JSON and the comparison line, of the least busy peer),
// the simulated time to finish, the mean of the peers' final validation losses, MB the policy sent
// per peer, and the inner steps all peers took (the tokens they trained over a batch's: a
// micro-batch of sync-target counts its share).
//
//   bench_heterogeneous [--data FILE] [--steps 600] [--peers 8] [--inner-steps 50] [--fastest 4]
//                       [--link heterogeneous] [--step-seconds 0.1] [--micro-batches 4] [--fragments 1]
//                       [--overlap 1] [--codec identity] [--halving-doubling 0] [--only ...] [--json heterogeneous.json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "output_file.hpp"
#include "shakespeare_recipe.hpp"

namespace dt = decentrain;

namespace {

struct setup {
  int peers = 8;
  std::string link = "heterogeneous";
  double step_seconds = 0.1;
  std::uint64_t seed = 1337;
  std::int64_t inner_steps = 50;
  std::int64_t fragments = 1, overlap = 1;  // Streaming DiLoCo's
  std::string codec = "identity";
  std::vector<double> speeds;
  // Set: the run is timed (each peer's compute on its thread's clock, its speed scaled so that an
  // inner step at speed 1 moves its clock step_seconds), not the deterministic simulator's.
  double measured_step_s = 0;
};

struct row {
  std::string name;
  double util_slowest = 0, util_fastest = 0, util_lowest = 1, simulated_s = 0, val_loss = 0, mb_per_peer = 0, wall_s = 0;
  // The least busy peer through the step before the last: without the last step's exchange,
  // which nothing is left to hide behind (and a longer run spreads thinner).
  double util_lowest_before_last = 1;
  double inner_steps = 0;  // all peers' together
  std::vector<double> peer_inner_steps;  // each peer's, by rank
  std::int64_t steps = 0;
  std::vector<dt::comm::tuning_choice> picks;  // a tuned run's (rank 0's)
};

template <class Comm>
row run(const std::string& name, const Comm& comm, const setup& s, const std::vector<double>& speeds, const dt::nn::gpt_config& cfg,
        dt::train::trainer_options opts, const dt::data::token_dataset& data) {
  using Trainer = dt::train::trainer<dt::nn::gpt<dt::cpu>, Comm>;
  std::fprintf(stderr, "running %s (%lld steps) ...\n", name.c_str(), static_cast<long long>(opts.steps));
  dt::transport::in_process::options o;
  o.seed = s.seed;
  o.recv_timeout = std::chrono::minutes(30);
  o.speeds = speeds;
  if (s.measured_step_s > 0) {  // timed: lanes run beside the compute (the deterministic simulator has none)
    for (auto& v : o.speeds) v *= s.measured_step_s / s.step_seconds;
    opts.compute_on_thread_clock = true;
    opts.stop_check_every = opts.steps;  // (nothing asks to stop)
  } else {
    o.deterministic = dt::transport::in_process::deterministic_run{.step_seconds = s.step_seconds};
  }
  dt::transport::in_process net(dt::transport::links::preset(s.link, s.peers, s.seed), o);
  const auto t0 = std::chrono::steady_clock::now();
  row r;
  std::vector<dt::train::step_metrics> before_last(static_cast<std::size_t>(s.peers));
  // (Captures everything by reference: a policy without choices() uses nothing.)
  const auto keep_picks = [&](Trainer& t) {
    t.on_step([&before_last, last = opts.steps - 1](const dt::train::step_metrics& m) {
      if (m.step == last) before_last.at(static_cast<std::size_t>(m.rank)) = m;  // (each peer its own slot)
    });
    if constexpr (requires { t.policy().choices(); })
      if (t.rank() == 0)
        t.on_step([&r, &t](const dt::train::step_metrics&) {
          r.picks = t.policy().choices();
          if constexpr (requires { t.policy().last_exchange(); })  // (Streaming DiLoCo's, its why saying so)
            if (const auto& last = t.policy().last_exchange()) r.picks.push_back(*last);
        });
  };
  const auto results = dt::train::fit_in_process<Trainer>(net, cfg, opts, data, comm, keep_picks);
  r.name = name;
  r.steps = opts.steps;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::int64_t tokens_per_inner_step = opts.batch_size * (opts.block_size > 0 ? opts.block_size : cfg.block_size);
  const auto slowest = static_cast<std::size_t>(std::min_element(speeds.begin(), speeds.end()) - speeds.begin());
  const auto fastest = static_cast<std::size_t>(std::max_element(speeds.begin(), speeds.end()) - speeds.begin());
  for (std::size_t p = 0; p < results.size(); ++p) {
    const auto& m = results[p].last;
    r.val_loss += results[p].final_val_loss / static_cast<double>(results.size());
    r.simulated_s = std::max(r.simulated_s, m.clock_s);
    r.mb_per_peer += static_cast<double>(m.policy_bytes_sent) / 1e6 / static_cast<double>(results.size());
    r.peer_inner_steps.push_back(static_cast<double>(m.tokens) / static_cast<double>(tokens_per_inner_step));
    r.inner_steps += r.peer_inner_steps.back();
    r.util_lowest = std::min(r.util_lowest, m.utilisation());
    r.util_lowest_before_last = std::min(r.util_lowest_before_last, before_last[p].utilisation());
  }
  r.util_slowest = results[slowest].last.utilisation();
  r.util_fastest = results[fastest].last.utilisation();
  std::fprintf(stderr, "  %s: val loss %.4f, utilisation %.1f%% .. %.1f%% (least busy %.1f%%, %.1f%% before the last step), %.0f "
               "simulated s, %.0f s; inner steps (busy before the last step) by speed:", name.c_str(), r.val_loss,
               100 * r.util_slowest, 100 * r.util_fastest, 100 * r.util_lowest, 100 * r.util_lowest_before_last, r.simulated_s,
               r.wall_s);
  for (std::size_t p = 0; p < results.size(); ++p)
    std::fprintf(stderr, " %.2fx %.0f (%.1f%%)", speeds[p], r.peer_inner_steps[p], 100 * before_last[p].utilisation());
  std::fprintf(stderr, "\n");
  for (const auto& c : r.picks)
    std::fprintf(stderr, "    pick after step %lld (%s): H %lld, %lld fragments, overlap %lld, %s, exchange %.3f s, %.1f%% busy "
                 "predicted; step %.4f s, fixed %.3f s, %.3g s/MB (recursive doubling: small %.3f s, %.3g s/MB)\n",
                 static_cast<long long>(c.step), c.why.c_str(), static_cast<long long>(c.inner_steps), static_cast<long long>(c.fragments),
                 static_cast<long long>(c.overlap), c.codec_name.c_str(), c.exchange_s, 100 * c.busy, c.measured.step_s,
                 c.measured.fixed_s, 1e6 * c.measured.per_byte_s, c.measured.small_s, 1e6 * c.measured.rd_per_byte_s);
  return r;
}

dt::comm::diloco<> diloco(const setup& s, bool sized) {
  dt::comm::diloco<> p;
  p.inner_steps = s.inner_steps;
  p.sized_to_speed = sized;
  return p;
}

// Tuned: H and the codec picked from measures (H = --inner-steps until the first pick).
dt::comm::diloco<dt::comm::outer::nesterov, dt::collective::any_codec> tuned(const setup& s) {
  dt::comm::diloco<dt::comm::outer::nesterov, dt::collective::any_codec> p;
  p.inner_steps = s.inner_steps;
  p.tune.emplace();
  for (const char* spec : {"identity", "int8", "int4"}) p.tune->codecs.push_back(dt::collective::parse_codec(spec));
  return p;
}

dt::comm::streaming_diloco<dt::comm::outer::nesterov, dt::collective::any_codec> streaming(const setup& s, bool sized) {
  dt::comm::streaming_diloco<dt::comm::outer::nesterov, dt::collective::any_codec> p;
  p.inner_steps = s.inner_steps;
  p.fragments = s.fragments;
  p.overlap = s.overlap;
  p.codec = dt::collective::parse_codec(s.codec);
  p.sized_to_speed = sized;
  return p;
}

// Tuned as the command line's --auto tunes it: H, P, tau and the codec picked from measures.
dt::comm::streaming_diloco<dt::comm::outer::nesterov, dt::collective::any_codec> streaming_tuned(const setup& s, bool sized) {
  auto p = streaming(s, sized);
  p.tune.emplace();
  for (const char* spec : {"identity", "int8", "int4"}) p.tune->codecs.push_back(dt::collective::parse_codec(spec));
  return p;
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args cli(argc, argv, "usage: bench_heterogeneous [--flag value]...");
  auto value = [&](const std::string& key, const std::string& fallback) { return cli.value(key, fallback); };
  const std::string path = value("data", DECENTRAIN_SOURCE_DIR "/../shared/data/tinyshakespeare.txt");
  setup s;
  s.peers = std::stoi(value("peers", "8"));
  s.link = value("link", "heterogeneous");
  s.step_seconds = std::stod(value("step-seconds", "0.1"));
  s.inner_steps = std::stoll(value("inner-steps", "50"));
  const double fastest = std::stod(value("fastest", "4"));
  const std::int64_t micro_batches = std::stoll(value("micro-batches", "4"));
  s.fragments = std::stoll(value("fragments", "1"));
  s.overlap = std::stoll(value("overlap", "1"));
  s.codec = value("codec", "identity");
  const std::string json_path = value("json", "heterogeneous.json");
  std::vector<std::string> only;
  {
    std::stringstream in(value("only", "sync,sync-target,sync-homogeneous,diloco-equal,diloco-sized,diloco-homogeneous"));
    for (std::string item; std::getline(in, item, ',');) only.push_back(item);
  }
  auto opts = bench::shakespeare_recipe::options(std::stoll(value("steps", "600")));
  opts.eval_every = 0;
  opts.eval_batches = std::stoll(value("eval-batches", "10"));
  // (1: all-reduces of 2^k peers by recursive halving and doubling where they would take the
  // ring, a codec's too: collective::options::halving_doubling)
  const std::string halving = value("halving-doubling", "0");
  dt::detail::check(halving == "0" || halving == "1", "bench_heterogeneous: --halving-doubling is 0 or 1, not '", halving, "'");
  opts.collectives.halving_doubling = halving == "1";
  cli.finish();
  bench::output_file json(json_path);
  s.speeds = dt::transport::speeds::spread(s.peers, s.seed, fastest);
  const double mean_speed = std::accumulate(s.speeds.begin(), s.speeds.end(), 0.0) / s.peers;
  const std::vector<double> even(static_cast<std::size_t>(s.peers), mean_speed);

  const auto recipe = bench::shakespeare_recipe::load(path);
  std::vector<row> rows;
  // A homogeneous row's options: as many steps as give the tokens the row `of` trained (its
  // inner steps, all peers together), which must have run before it.
  const auto same_tokens_as = [&](const std::string& name, const char* of) {
    const auto it = std::find_if(rows.begin(), rows.end(), [&](const row& r) { return r.name == of; });
    dt::detail::check(it != rows.end() && it->inner_steps > 0, "bench_heterogeneous: ", name, " runs after ", of, " (its tokens)");
    auto same = opts;
    same.steps = std::llround(it->inner_steps / s.peers);
    return same;
  };
  // Streaming DiLoCo's exchanges run on lanes beside the compute, which the deterministic
  // simulator does not offer: its rows are timed, an inner step at speed 1 as long as
  // --step-seconds (measured once, when first needed).
  auto timed = [&, measured = setup{}]() mutable {
    if (measured.measured_step_s == 0) {
      measured = s;
      measured.measured_step_s = bench::shakespeare_recipe::step_seconds(recipe.model, opts, recipe.data);
      std::fprintf(stderr, "one inner step computes in %.1f ms here (thread CPU time)\n", 1e3 * measured.measured_step_s);
    }
    return measured;
  };
  for (const auto& name : only) {
    if (name == "sync") rows.push_back(run(name, dt::comm::sync_allreduce<>{}, s, s.speeds, recipe.model, opts, recipe.data));
    else if (name == "sync-target") {
      dt::detail::check(micro_batches >= 1 && opts.batch_size % micro_batches == 0, "bench_heterogeneous: --micro-batches ",
                        micro_batches, " must divide the batch of ", opts.batch_size, " rows");
      dt::comm::sync_allreduce<> target;
      target.target_batch = opts.batch_size * s.peers;
      auto micro = opts;
      micro.batch_size = opts.batch_size / micro_batches;
      auto charged = s;  // a micro-batch costs its share of an inner step
      charged.step_seconds = s.step_seconds / static_cast<double>(micro_batches);
      rows.push_back(run(name, target, charged, s.speeds, recipe.model, micro, recipe.data));
      rows.back().inner_steps /= static_cast<double>(micro_batches);  // (counted in micro-batches: in inner steps of the batch's rows)
    }
    else if (name == "sync-homogeneous") rows.push_back(run(name, dt::comm::sync_allreduce<>{}, s, even, recipe.model, opts, recipe.data));
    else if (name == "diloco-equal") rows.push_back(run(name, diloco(s, false), s, s.speeds, recipe.model, opts, recipe.data));
    else if (name == "diloco-sized") rows.push_back(run(name, diloco(s, true), s, s.speeds, recipe.model, opts, recipe.data));
    else if (name == "diloco-homogeneous")
      rows.push_back(run(name, diloco(s, false), s, even, recipe.model, same_tokens_as(name, "diloco-sized"), recipe.data));
    else if (name == "diloco-auto") rows.push_back(run(name, tuned(s), s, s.speeds, recipe.model, opts, recipe.data));
    else if (name == "diloco-auto-homogeneous")
      rows.push_back(run(name, tuned(s), s, even, recipe.model, same_tokens_as(name, "diloco-auto"), recipe.data));
    else if (name == "streaming-equal") rows.push_back(run(name, streaming(s, false), timed(), s.speeds, recipe.model, opts, recipe.data));
    else if (name == "streaming-sized") rows.push_back(run(name, streaming(s, true), timed(), s.speeds, recipe.model, opts, recipe.data));
    else if (name == "streaming-homogeneous")
      rows.push_back(run(name, streaming(s, false), timed(), even, recipe.model, same_tokens_as(name, "streaming-sized"), recipe.data));
    else if (name == "streaming-auto")
      rows.push_back(run(name, streaming_tuned(s, true), timed(), s.speeds, recipe.model, opts, recipe.data));
    else if (name == "streaming-auto-homogeneous")
      rows.push_back(run(name, streaming_tuned(s, false), timed(), even, recipe.model, same_tokens_as(name, "streaming-auto"), recipe.data));
    else {
      dt::detail::fail("bench_heterogeneous: unknown row '", name, "' (sync, sync-target, sync-homogeneous, diloco-equal, ",
                       "diloco-sized, diloco-homogeneous, diloco-auto, diloco-auto-homogeneous, streaming-equal, ",
                       "streaming-sized, streaming-homogeneous, streaming-auto, streaming-auto-homogeneous)");
    }
  }

  std::printf("%d in-process peers of speeds", s.peers);
  for (const double v : s.speeds) std::printf(" %.2f", v);
  std::printf(" (mean %.2f) on '%s' links, %.2f simulated s of compute an inner step at speed 1, H = %lld, %lld steps of %lld x %lld tokens"
              "; Streaming DiLoCo's fragments %lld, overlap %lld, codec %s\n\n",
              mean_speed, s.link.c_str(), s.step_seconds, static_cast<long long>(s.inner_steps), static_cast<long long>(opts.steps),
              static_cast<long long>(opts.batch_size), static_cast<long long>(opts.block_size), static_cast<long long>(s.fragments),
              static_cast<long long>(s.overlap), s.codec.c_str());
  std::printf("%-22s %7s %12s %12s %12s %13s %9s %9s %12s\n", "run", "steps", "util slowest", "util fastest", "least (-1)",
              "simulated s", "val loss", "MB/peer", "inner steps");
  for (const auto& r : rows)
    std::printf("%-22s %7lld %11.1f%% %11.1f%% %11.1f%% %13.0f %9.4f %9.1f %12.0f\n", r.name.c_str(), static_cast<long long>(r.steps),
                100 * r.util_slowest, 100 * r.util_fastest, 100 * r.util_lowest_before_last, r.simulated_s, r.val_loss, r.mb_per_peer,
                r.inner_steps);
  std::printf("(least (-1): the least busy peer through the step before the last, whose exchange nothing is left to hide)\n");
  const auto find = [&](const std::string& name) -> const row* {
    for (const auto& r : rows)
      if (r.name == name) return &r;
    return nullptr;
  };
  if (const auto *sized = find("diloco-sized"), *homogeneous = find("diloco-homogeneous"); sized && homogeneous)
    std::printf("\ndiloco-sized against diloco-homogeneous (the same tokens): time %.3fx (goal <= 1.1x), loss %+.2f%% (goal "
                "within 2%%), every peer >= 95%% busy: %s (the least busy %.1f%%)\n",
                sized->simulated_s / homogeneous->simulated_s, 100 * (sized->val_loss / homogeneous->val_loss - 1),
                sized->util_lowest >= 0.95 ? "yes" : "no", 100 * sized->util_lowest);
  if (const auto *tuned_row = find("diloco-auto"), *homogeneous = find("diloco-auto-homogeneous"); tuned_row && homogeneous)
    std::printf("diloco-auto against diloco-auto-homogeneous (the same tokens): time %.3fx (goal <= 1.1x), loss %+.2f%% (goal "
                "within 2%%), every peer >= 95%% busy: %s (the least busy %.1f%%)\n",
                tuned_row->simulated_s / homogeneous->simulated_s, 100 * (tuned_row->val_loss / homogeneous->val_loss - 1),
                tuned_row->util_lowest >= 0.95 ? "yes" : "no", 100 * tuned_row->util_lowest);
  if (const auto *sized = find("streaming-sized"), *homogeneous = find("streaming-homogeneous"); sized && homogeneous)
    std::printf("streaming-sized against streaming-homogeneous (the same tokens): time %.3fx (goal <= 1.1x), loss %+.2f%% (goal "
                "within 2%%), every peer >= 95%% busy: %s (the least busy %.1f%%; %.1f%% before the last step)\n",
                sized->simulated_s / homogeneous->simulated_s, 100 * (sized->val_loss / homogeneous->val_loss - 1),
                sized->util_lowest >= 0.95 ? "yes" : "no", 100 * sized->util_lowest, 100 * sized->util_lowest_before_last);
  if (const auto *tuned_row = find("streaming-auto"), *homogeneous = find("streaming-auto-homogeneous"); tuned_row && homogeneous)
    std::printf("streaming-auto against streaming-auto-homogeneous (the same tokens): time %.3fx (goal <= 1.1x), loss %+.2f%% "
                "(goal within 2%%), every peer >= 95%% busy: %s (the least busy %.1f%%; %.1f%% before the last step)\n",
                tuned_row->simulated_s / homogeneous->simulated_s, 100 * (tuned_row->val_loss / homogeneous->val_loss - 1),
                tuned_row->util_lowest >= 0.95 ? "yes" : "no", 100 * tuned_row->util_lowest, 100 * tuned_row->util_lowest_before_last);
  if (const auto *target = find("sync-target"), *homogeneous = find("sync-homogeneous"); target && homogeneous)
    std::printf("sync-target against sync-homogeneous (the same rows a step): time %.3fx, loss %+.2f%%, the least busy "
                "peer %.1f%% (sync with equal batches: %s)\n",
                target->simulated_s / homogeneous->simulated_s, 100 * (target->val_loss / homogeneous->val_loss - 1),
                100 * target->util_lowest,
                find("sync") ? dt::detail::concat(100 * find("sync")->util_lowest, "%").c_str() : "not run");

  std::ostringstream out;
  out << "{\n  \"peers\": " << s.peers << ", \"link\": \"" << s.link << "\", \"step_seconds\": " << s.step_seconds
      << ", \"inner_steps\": " << s.inner_steps << ", \"fragments\": " << s.fragments << ", \"overlap\": " << s.overlap
      << ", \"codec\": \"" << s.codec << "\", \"steps\": " << opts.steps << ", \"speeds\": [";
  for (std::size_t i = 0; i < s.speeds.size(); ++i) out << (i ? ", " : "") << s.speeds[i];
  out << "],\n  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? ",\n" : "\n") << "    {\"run\": \"" << r.name << "\", \"steps\": " << r.steps << ", \"util_slowest\": " << r.util_slowest
        << ", \"util_fastest\": " << r.util_fastest << ", \"util_lowest\": " << r.util_lowest
        << ", \"util_lowest_before_last\": " << r.util_lowest_before_last << ", \"simulated_s\": " << r.simulated_s << ", \"val_loss\": " << r.val_loss
        << ", \"mb_per_peer\": " << r.mb_per_peer << ", \"inner_steps\": " << r.inner_steps << ", \"wall_s\": " << r.wall_s << ", \"peer_inner_steps\": [";
    for (std::size_t p = 0; p < r.peer_inner_steps.size(); ++p) out << (p ? ", " : "") << r.peer_inner_steps[p];
    out << "]";
    if (!r.picks.empty()) {
      out << ", \"picks\": [";
      for (std::size_t k = 0; k < r.picks.size(); ++k) {
        const auto& c = r.picks[k];
        out << (k ? ", " : "") << "{\"step\": " << c.step << ", \"why\": \"" << c.why << "\", \"inner_steps\": " << c.inner_steps
            << ", \"fragments\": " << c.fragments << ", \"overlap\": " << c.overlap
            << ", \"codec\": \"" << c.codec_name << "\", \"exchange_s\": " << c.exchange_s << ", \"busy\": " << c.busy
            << ", \"step_s\": " << c.measured.step_s << ", \"fixed_s\": " << c.measured.fixed_s << ", \"per_byte_s\": " << c.measured.per_byte_s
            << ", \"small_s\": " << c.measured.small_s << ", \"rd_per_byte_s\": " << c.measured.rd_per_byte_s << "}";
      }
      out << "]";
    }
    out << "}";
  }
  out << "\n  ]\n}\n";
  json.stream() << out.str();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_heterogeneous: %s\n", e.what());
  return 1;
}
