// Pipeline parallelism (parallel/pipeline.hpp): nn::gpt cut into stages, every schedule run by
// one executor over in-process peers, against one peer that holds the whole model. Each stage's
// gradients are the whole model's (the tied embedding's two halves summed on both end stages),
// the clipping norm is the whole model's, S x R peers train as one peer with an R-times batch,
// a pipeline resumes bit-exactly, and bad settings are refused naming the setting.
#include "../support/trainer_fixture.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dt = decentrain;
using Catch::Matchers::Contains;
using fixture::small_corpus;
using fixture::relative_diff;
using fixture::tiny_gpt;

namespace {

// Four blocks, so that up to four stages hold one each.
dt::nn::gpt_config four_blocks() {
  auto c = tiny_gpt();
  c.n_layer = 4;
  return c;
}

dt::parallel::pipeline<> piped(int stages, int micro, const char* schedule = "1f1b", int chunks = 0) {
  dt::parallel::pipeline<> p;
  p.stages = stages;
  p.micro_batches = micro;
  p.schedule = schedule;
  p.chunks = chunks;
  return p;
}

// Each peer's gradients by parameter name on step 0, right after the backward (before any
// exchange and the clipping): fixture::probe, each peer writing its own slot.
using by_name = fixture::probe<dt::comm::sync_allreduce<>>;
using named_values = std::vector<std::map<std::string, std::vector<float>>>;  // by rank

using Whole = dt::train::trainer<dt::nn::gpt<dt::cpu>, by_name>;
using Piped = dt::train::trainer<dt::nn::gpt<dt::cpu>, by_name, dt::parallel::pipeline<>>;

struct run_record {
  named_values grads;   // by rank, step 0
  named_values params;  // by rank, at the end
  std::vector<dt::train::fit_result> results;
  std::map<int, double> grad_norm;  // by rank, the last step's
  std::map<int, int> peak_deferred;  // by rank, the last step's most weight halves owed at once
};

template <class Trainer>
run_record train(int world, const dt::train::trainer_options& opts, typename Trainer::parallel_policy parallel = {},
                 const dt::nn::gpt_config& model = four_blocks()) {
  run_record rec;
  rec.grads.resize(static_cast<std::size_t>(world));
  rec.params.resize(static_cast<std::size_t>(world));
  std::mutex lock;
  by_name comm;
  comm.named = &rec.grads;
  rec.results = dt::train::fit_in_process<Trainer>(
      dt::transport::in_process(world), model, opts, small_corpus().data, comm,
      [&](Trainer& t) {
        t.on_step([&, &t = t](const dt::train::step_metrics& m) {
          std::lock_guard hold(lock);
          rec.grad_norm[t.rank()] = m.grad_norm;
          if constexpr (requires { t.parallel().last_run(); }) rec.peak_deferred[t.rank()] = t.parallel().last_run().peak_deferred;
        });
        t.on_eval([&, &t = t](const dt::train::eval_point&) {
          std::map<std::string, std::vector<float>> mine;
          for (const auto& e : t.model().parameters()) {
            const auto v = e.param.value().contiguous();
            mine[e.name].assign(v.template data<float>(), v.template data<float>() + v.numel());
          }
          rec.params[static_cast<std::size_t>(t.rank())] = std::move(mine);
        });
      },
      1, parallel);
  return rec;
}

std::vector<float> values(const dt::tensor<dt::cpu>& t) {
  const auto c = t.contiguous();
  return {c.template data<float>(), c.template data<float>() + c.numel()};
}

// Every parameter a peer holds against the whole model's of the same name: the worst relative
// difference, and how many of the whole model's parameters some peer held.
struct comparison {
  double worst = 0;
  std::size_t covered = 0;
  std::vector<std::string> missing;
};
comparison compare(const named_values& peers, const std::map<std::string, std::vector<float>>& whole) {
  comparison c;
  for (const auto& [name, ref] : whole) {
    bool held = false;
    for (const auto& mine : peers)
      if (auto it = mine.find(name); it != mine.end()) {
        held = true;
        c.worst = std::max(c.worst, relative_diff(it->second, ref));
      }
    if (held) ++c.covered;
    else c.missing.push_back(name);
  }
  return c;
}

dt::train::trainer_options run_of(std::int64_t steps, std::int64_t batch) {
  auto o = fixture::small_run(steps);
  o.batch_size = batch;
  return o;
}

}  // namespace

TEST_CASE("pipeline: a cut GPT holds only its stage's parameters, drawn as the whole model draws them") {
  const auto cfg = four_blocks();
  dt::rng init_whole(7, "init");
  const dt::nn::gpt<dt::cpu> whole(cfg, init_whole);
  std::size_t held = 0;
  for (int s = 0; s < 4; ++s) {
    dt::rng init(7, "init");
    const dt::nn::gpt<dt::cpu> part(cfg, init, dt::nn::part{s, 4, {}});
    std::vector<std::string> names;
    for (const auto& e : part.parameters()) {
      names.push_back(e.name);
      CHECK(values(e.param.value()) == values(whole.parameters().get(e.name).value()));
      held += e.name == "wte.weight" ? 0 : 1;
    }
    const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    INFO("stage " << s);
    CHECK(has("wte.weight") == (s == 0 || s == 3));  // tied: on both end stages
    CHECK(has("wpe.weight") == (s == 0));
    CHECK(has("ln_f.weight") == (s == 3));
    CHECK(has("h." + std::to_string(s) + ".attn.c_attn.weight"));
    CHECK_FALSE(has("h." + std::to_string((s + 1) % 4) + ".attn.c_attn.weight"));
  }
  // Every parameter but the tied embedding is held by exactly one stage.
  CHECK(held + 1 == whole.parameters().size());
  // The whole model's loss() is refused on a part, naming what to use instead.
  dt::rng init(7, "init");
  const dt::nn::gpt<dt::cpu> part(cfg, init, dt::nn::part{1, 4, {}});
  const auto ids = dt::zeros<dt::cpu>(dt::shape{1, 4}, dt::dtype::i32);
  CHECK_THROWS_WITH(part.loss(ids, ids), Contains("stage 1 of 4") && Contains("stage_forward"));

  // Built to be loaded at once (skip_init: a part dealt out again), the same parameters and
  // shapes, zeros where the draws were, and nothing drawn from the stream.
  dt::rng untouched(7, "init");
  const auto before = untouched.state();
  const auto skipped = [&] {
    dt::skip_init loaded_later;
    return dt::nn::gpt<dt::cpu>(cfg, untouched, dt::nn::part{1, 4, {}});
  }();
  CHECK(untouched.state() == before);
  REQUIRE(skipped.parameters().size() == part.parameters().size());
  for (const auto& e : part.parameters()) {
    const auto& z = skipped.parameters().get(e.name).value();
    CHECK(z.shape() == e.param.value().shape());
    if (e.name.ends_with("attn.c_attn.weight")) CHECK(values(z) == std::vector<float>(values(z).size(), 0.0f));
  }
  CHECK_FALSE(dt::skip_init::active());  // its scope ended
}

TEST_CASE("pipeline: every schedule's gradients equal one peer's whole-model gradients, S = 1..4, M = 1..8, interleaved too") {
  const auto opts = run_of(1, 8);
  const auto whole = train<Whole>(1, opts);
  const auto& ref = whole.grads.at(0);
  REQUIRE(!ref.empty());
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"})
    for (int S = 1; S <= 4; ++S)
      for (int M = 1; M <= 8; ++M) {
        INFO(schedule << ": S = " << S << ", M = " << M);
        const auto r = train<Piped>(S, opts, piped(S, M, schedule));
        REQUIRE(r.grads.size() == static_cast<std::size_t>(S));
        const auto c = compare(r.grads, ref);
        CHECK(c.missing.empty());
        CHECK(c.covered == ref.size());
        CHECK(c.worst <= 1e-6);
        // Every stage reports the step's loss and the whole model's gradient norm.
        for (int p = 0; p < S; ++p) {
          CHECK(r.results[static_cast<std::size_t>(p)].last.loss ==
                Approx(whole.results[0].last.loss).epsilon(1e-6));
          CHECK(r.grad_norm.at(p) == Approx(whole.grad_norm.at(0)).epsilon(1e-6));
        }
      }
  // Two chunks a peer (the 4 blocks cut into 2 x S stages): interleaved (M a multiple of S) and
  // ZB-V (the first peer holds both ends of the model, the tied embedding's two uses on one peer).
  for (const char* schedule : {"interleaved", "zb-v"})
    for (int S = 1; S <= 2; ++S)
      for (int M = S; M <= 8; M += std::string(schedule) == "interleaved" ? S : 1) {
        INFO(schedule << ", 2 chunks: S = " << S << ", M = " << M);
        const auto r = train<Piped>(S, opts, piped(S, M, schedule, 2));
        const auto c = compare(r.grads, ref);
        CHECK(c.missing.empty());
        CHECK(c.worst <= 1e-6);
        for (int p = 0; p < S; ++p) CHECK(r.grad_norm.at(p) == Approx(whole.grad_norm.at(0)).epsilon(1e-6));
      }
}

TEST_CASE("pipeline: split backwards put the weight halves off, in f32 and in mixed precision, with whole backwards' gradients") {
  for (const auto compute : {dt::dtype::f32, dt::dtype::bf16}) {
    auto opts = run_of(1, 8);
    opts.compute_dtype = compute;
    // Each split schedule against a schedule of whole backwards on the same cut.
    for (const auto& [split, whole] : {std::pair{"zb-h1", "1f1b"}, std::pair{"zb-v", "interleaved"}}) {
      INFO(dt::dtype_name(compute) << ": " << split << " against " << whole);
      const auto ref_run = train<Piped>(2, opts, piped(2, 4, whole));
      std::map<std::string, std::vector<float>> ref;
      for (const auto& peer : ref_run.grads) ref.insert(peer.begin(), peer.end());
      REQUIRE(!ref.empty());
      const auto r = train<Piped>(2, opts, piped(2, 4, split));
      const auto c = compare(r.grads, ref);
      CHECK(c.missing.empty());
      CHECK(c.covered == ref.size());
      CHECK(c.worst <= 1e-6);
      for (int p = 0; p < 2; ++p) {
        CHECK(r.peak_deferred.at(p) > 0);  // the weight halves were put off
        CHECK(ref_run.peak_deferred.at(p) == 0);
      }
    }
  }
}

TEST_CASE("pipeline: ZB-V lays a peer's chunks in a V, the first peer holding both ends of the model") {
  const auto cfg = four_blocks();
  dt::rng init_whole(7, "init");
  const dt::nn::gpt<dt::cpu> whole(cfg, init_whole);
  const auto names_of = [&](int peer) {
    dt::rng init(7, "init");
    const dt::nn::gpt<dt::cpu> part(cfg, init, dt::nn::part{peer, 2, {}, 2, dt::nn::chunk_layout::v});
    std::vector<std::string> names;
    for (const auto& e : part.parameters()) {
      names.push_back(e.name);
      CHECK(values(e.param.value()) == values(whole.parameters().get(e.name).value()));
    }
    return names;
  };
  const auto has = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  const auto first = names_of(0), second = names_of(1);
  // Peer 0: model stages 0 and 3 (blocks 0 and 3, the embeddings, ln_f); peer 1: stages 1 and 2.
  for (const char* n : {"wte.weight", "wpe.weight", "ln_f.weight", "h.0.attn.c_attn.weight", "h.3.attn.c_attn.weight"}) {
    CHECK(has(first, n));
    CHECK_FALSE(has(second, n));
  }
  for (const char* n : {"h.1.attn.c_attn.weight", "h.2.attn.c_attn.weight"}) {
    CHECK(has(second, n));
    CHECK_FALSE(has(first, n));
  }
  CHECK(first.size() + second.size() == whole.parameters().size());  // nothing held twice
  // The pipeline places ZB-V's chunks so, the other schedules' looped.
  CHECK(piped(2, 2, "zb-v").place(0, 2).layout == dt::nn::chunk_layout::v);
  CHECK(piped(2, 2, "interleaved", 2).place(1, 2).layout == dt::nn::chunk_layout::looped);
}

TEST_CASE("pipeline: the tied embedding gets one gradient, the sum of its two uses, on both end stages") {
  const auto opts = run_of(1, 4);
  const auto whole = train<Whole>(1, opts);
  const auto r = train<Piped>(3, opts, piped(3, 2));
  const auto& ref = whole.grads.at(0).at("wte.weight");
  const auto& first = r.grads.at(0).at("wte.weight");
  const auto& last = r.grads.at(2).at("wte.weight");
  CHECK(first == last);  // the same sum on both, bit for bit
  CHECK(relative_diff(first, ref) <= 1e-6);
  CHECK(r.grads.at(1).count("wte.weight") == 0);
}

TEST_CASE("pipeline: clipping takes the whole model's norm, so clipped stages train as one peer does") {
  auto opts = run_of(5, 4);
  opts.grad_clip = 0.05;  // well below the norm: every step clips
  const auto whole = train<Whole>(1, opts);
  REQUIRE(whole.grad_norm.at(0) > 0.05);
  for (int S : {2, 4}) {
    INFO("S = " << S);
    const auto r = train<Piped>(S, opts, piped(S, 2));
    const auto c = compare(r.params, whole.params.at(0));
    CHECK(c.covered == whole.params.at(0).size());
    // AdamW turns rounding-level differences in near-zero gradients into differences of up to a
    // learning rate; per-stage norms instead of the whole model's give 0.23 here.
    CHECK(c.worst <= 5e-4);
    for (int p = 0; p < S; ++p) CHECK(r.grad_norm.at(p) == Approx(whole.grad_norm.at(0)).epsilon(1e-5));
  }
}

TEST_CASE("pipeline: S x R peers train as one peer with an R-times batch") {
  auto opts = run_of(4, 4);
  const auto r = train<Piped>(4, opts, piped(2, 2));  // 2 stages x 2 copies, 4 rows each
  opts.batch_size = 8;
  const auto whole = train<Whole>(1, opts);
  const auto c = compare(r.params, whole.params.at(0));
  CHECK(c.covered == whole.params.at(0).size());
  CHECK(c.worst <= 5e-4);  // as in the clipping case: AdamW on rounding-level differences
  // The copies of a stage hold the same parameters (the communication policy averaged them).
  CHECK(r.params.at(0) == r.params.at(2));
  CHECK(r.params.at(1) == r.params.at(3));
  for (const auto& res : r.results) CHECK(res.final_val_loss == Approx(whole.results[0].final_val_loss).epsilon(1e-5));
}

TEST_CASE("pipeline: peers placed by a grid (parallel::place_by_links) train as peers in rank order do") {
  const auto opts = run_of(4, 4);
  const auto in_order = train<Piped>(4, opts, piped(2, 2));
  auto placed = piped(2, 2);
  placed.ranks = {{3, 0}, {1, 2}};  // stage 0 of copies 0 and 1 on peers 3 and 0, stage 1 on 1 and 2
  CHECK(placed.place(3, 4).stage == 0);
  CHECK(placed.place(3, 4).copy == 0);
  CHECK(placed.place(0, 4).pipeline == std::vector<int>{0, 2});
  CHECK(placed.place(2, 4).replicas == std::vector<int>{1, 2});
  const auto r = train<Piped>(4, opts, placed);
  // Peer 3 holds what peer 0 held in rank order (stage 0 of copy 0), peer 1 what peer 1 held.
  CHECK(r.params.at(3) == in_order.params.at(0));
  CHECK(r.params.at(1) == in_order.params.at(1));
  for (const auto& res : r.results) CHECK(res.final_val_loss == Approx(in_order.results[0].final_val_loss).epsilon(1e-12));
  placed.ranks = {{3, 0}, {1, 1}};
  CHECK_THROWS_WITH(train<Piped>(4, opts, placed), Contains("must hold each of the 4 ranks once"));
}

TEST_CASE("pipeline: any S and M reach one process's loss within 1e-4 after 30 steps") {
  const auto opts = run_of(30, 4);
  const auto whole = train<Whole>(1, opts);
  for (int S : {2, 4})
    for (int M : {1, 3, 4}) {
      INFO("S = " << S << ", M = " << M);
      const auto r = train<Piped>(S, opts, piped(S, M));
      for (const auto& res : r.results) {
        CHECK(std::abs(res.final_val_loss - whole.results[0].final_val_loss) <= 1e-4);
        CHECK(std::abs(res.last.loss - whole.results[0].last.loss) <= 1e-4);
      }
    }
}

TEST_CASE("pipeline: a pipeline resumes from its stages' checkpoints bit-exactly") {
  auto opts = run_of(8, 4);
  opts.eval_every = 0;
  using Plain = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::pipeline<>>;
  const auto p = piped(2, 2);
  const auto full = fixture::final_params<Plain>(4, four_blocks(), opts, {}, nullptr, p);
  const auto saved = fixture::stop_at<Plain>(4, 3, four_blocks(), opts, {}, p);
  for (const auto& c : saved) REQUIRE(c.counter("trainer.world") == 4);
  const auto resumed = fixture::resume_from<Plain>(saved, four_blocks(), opts, {}, p);
  for (std::size_t r = 0; r < 4; ++r) CHECK(resumed[r] == full[r]);
}

TEST_CASE("pipeline: activations through a codec: the bytes it says, and gradients near the exact ones") {
  const auto opts = run_of(1, 4);
  using Half = dt::train::trainer<dt::nn::gpt<dt::cpu>, by_name, dt::parallel::pipeline<fixture::bf16_codec>>;
  dt::parallel::pipeline<fixture::bf16_codec> half;
  half.stages = 2;
  half.micro_batches = 2;
  std::vector<std::uint64_t> sent_half(2), sent_exact(2);  // by rank: each peer writes its own
  const auto bytes_of = [](auto& sent) {
    return [&sent](auto& t) {
      t.on_step([&sent, &t](const dt::train::step_metrics&) {
        sent[static_cast<std::size_t>(t.rank())] = t.parallel().last_run().bytes_sent;
      });
    };
  };
  by_name comm;
  named_values grads(2);
  comm.named = &grads;
  dt::train::fit_in_process<Half>(dt::transport::in_process(2), four_blocks(), opts, small_corpus().data, comm,
                                  bytes_of(sent_half), 1, half);
  dt::train::fit_in_process<Piped>(dt::transport::in_process(2), four_blocks(), opts, small_corpus().data, {},
                                   bytes_of(sent_exact), 1, piped(2, 2));
  const auto whole = train<Whole>(1, opts);
  // Stage 0 sends 2 micro-batches' activations (2 rows x 16 x 32 values), stage 1 their
  // gradients; each with a 56-byte header: 4 bytes a value exact, 2 through bf16.
  static_assert(sizeof(dt::parallel::schedule::detail::wire_header) == 56);
  const std::uint64_t n = 2 * 2 * 16 * 32, headers = 2 * 56;
  CHECK(sent_exact[0] == n * 4 + headers);
  CHECK(sent_exact[1] == n * 4 + headers);
  CHECK(sent_half[0] == n * 2 + headers);
  CHECK(sent_half[1] == n * 2 + headers);
  const auto c = compare(grads, whole.grads.at(0));
  CHECK(c.worst > 1e-6);  // rounded on the way
  CHECK(c.worst < 0.05);
}

TEST_CASE("pipeline: a subspace model's stages send k coefficients a token, with the whole model's gradients") {
  auto model = four_blocks();
  model.subspace = 4;  // of n_embd 32: 8x fewer values between stages
  const auto opts = run_of(1, 4);
  const auto whole = train<Whole>(1, opts, {}, model);
  const auto& ref = whole.grads.at(0);
  REQUIRE(ref.count("lm_head.weight") == 1);
  for (int S : {2, 4}) {
    INFO("S = " << S);
    std::vector<std::uint64_t> sent(static_cast<std::size_t>(S));  // by rank: each peer writes its own
    by_name comm;
    named_values grads(static_cast<std::size_t>(S));
    comm.named = &grads;
    dt::train::fit_in_process<Piped>(dt::transport::in_process(S), model, opts, small_corpus().data, comm,
                                     [&sent](auto& t) {
                                       t.on_step([&sent, &t](const dt::train::step_metrics&) {
                                         sent[static_cast<std::size_t>(t.rank())] = t.parallel().last_run().bytes_sent;
                                       });
                                     },
                                     1, piped(S, 2));
    // The stream is rebuilt exactly from the coefficients and the ids: every gradient is the
    // whole model's but for the order of float sums.
    const auto c = compare(grads, ref);
    CHECK(c.missing.empty());
    CHECK(c.worst <= 1e-5);
    // Each boundary carries 2 micro-batches of 2 rows x 16 tokens x k = 4 values (f32) a way, and
    // a 56-byte header each: the first stage sends activations only, the last gradients only.
    const std::uint64_t one_way = 2 * 2 * 16 * 4 * 4 + 2 * 56;
    CHECK(sent.front() == one_way);
    CHECK(sent.back() == one_way);
    for (int p = 1; p + 1 < S; ++p) CHECK(sent[static_cast<std::size_t>(p)] == 2 * one_way);
  }
}

TEST_CASE("pipeline: bad settings are refused naming the setting") {
  const auto opts = run_of(1, 4);
  const auto fails = [&](int world, dt::parallel::pipeline<> p) {
    dt::train::fit_in_process<Piped>(dt::transport::in_process(world), four_blocks(), opts, small_corpus().data, {}, {}, 1, p);
  };
  CHECK_THROWS_WITH(fails(5, piped(5, 1)), Contains("stages must be <= 4"));
  CHECK_THROWS_WITH(fails(2, piped(2, 0)), Contains("micro-batches must be >= 1"));
  CHECK_THROWS_WITH(fails(2, piped(2, 5)), Contains("5 micro-batches of 4 rows"));
  CHECK_THROWS_WITH(fails(3, piped(2, 1)), Contains("3 peers do not divide into copies of 2 stages"));
  CHECK_THROWS_WITH(fails(2, piped(2, 1, "zb-w")), Contains("unknown schedule 'zb-w'"));
  CHECK_THROWS_WITH(fails(2, piped(2, 2, "zb-v", 3)), Contains("schedule zb-v runs 2 chunk(s) per peer, not 3"));
  CHECK_THROWS_WITH(fails(4, piped(4, 4, "zb-v")), Contains("8 stages (stages x chunks) cut a model of 4 blocks"));
  CHECK_THROWS_WITH(fails(2, piped(2, 3, "interleaved", 2)), Contains("micro-batches (3) must be a multiple of the peers (2)"));
  CHECK_THROWS_WITH(fails(2, piped(2, 2, "interleaved", 3)), Contains("6 stages (stages x chunks) cut a model of 4 blocks"));
  auto uneven = piped(2, 1);
  uneven.blocks = {3, 2};
  CHECK_THROWS_WITH(fails(2, uneven), Contains("blocks per stage add up to 5, the model has 4"));
  // An uneven cut that adds up trains as the even one does.
  uneven.blocks = {3, 1};
  CHECK_NOTHROW(fails(2, uneven));
}

TEST_CASE("pipeline: a stage refuses an activation of another shape or an oversized payload, naming it") {
  namespace ps = dt::parallel::schedule;
  const auto cfg = four_blocks();
  const auto p = ps::gpipe(2, 1);
  const auto [x, y] = small_corpus().data.batch<dt::cpu>(dt::data::split::train, 0, 2, 16, 1);
  const std::vector<ps::micro_batch> micro{{x, y, 1.0}};
  struct lie {
    std::int64_t width;
    std::uint64_t bytes;
    const char* says;
  };
  for (const auto& l : {lie{cfg.n_embd + 1, 0, "with shape (2, 16, 33)"},
                        lie{std::int64_t{1} << 40, 0, "with shape (2, 16, 1099511627776)"},
                        lie{cfg.n_embd, std::uint64_t{1} << 40, "announced 1099511627776 bytes for 1024 values"}}) {
    std::string error;  // peer 1's, read on the test's thread
    dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
      dt::collective::communicator<dt::transport::in_process::endpoint> comm(ep);
      if (ep.rank() == 0) {
        ps::detail::wire_header h;
        h.stage = 1;
        h.rank = 3;
        h.dims[0] = 2;
        h.dims[1] = 16;
        h.dims[2] = l.width;
        h.bytes = l.bytes;
        comm.send_to(1, std::span<const ps::detail::wire_header>(&h, 1));
        return;
      }
      dt::rng init(1, "init");
      dt::nn::gpt<dt::cpu> stage(cfg, init, dt::nn::part{1, 2, {}});
      dt::compress::identity codec;
      try {
        (void)ps::execute(p, 1, stage, comm, {0, 1}, micro, codec, true);
      } catch (const dt::error& e) {
        error = e.what();
      }
    });
    INFO(error);
    CHECK_THAT(error, Contains("peer 0 sent") || Contains("peer 0 announced"));
    CHECK_THAT(error, Contains(l.says));
  }
}

namespace {
// docs/guide.md's own schedule, as the guide writes it: all forwards, then the backwards newest first.
namespace ps = dt::parallel::schedule;
ps::program newest_first(int S, int M) {
  ps::check_shape("newest-first", S, M);
  auto p = ps::one_stage_per_peer(S, M);
  for (int s = 0; s < S; ++s) {
    auto& list = p.actions[static_cast<std::size_t>(s)];
    for (int m = 0; m < M; ++m) list.push_back({ps::op::forward, m, s});
    for (int m = M - 1; m >= 0; --m) list.push_back({ps::op::backward, m, s});
  }
  return p;
}
}  // namespace

TEST_CASE("pipeline: a schedule written outside the library runs through the same executor, with the same gradients") {
  const auto cfg = four_blocks();
  const auto p = newest_first(2, 3);
  ps::check(p);
  // 5 rows in 3 uneven micro-batches (2, 2, 1), each weighted by its rows.
  const auto [x, y] = small_corpus().data.batch<dt::cpu>(dt::data::split::train, 0, 5, 16, 1);
  std::vector<ps::micro_batch> micro;
  for (const auto& [from, to] : {std::pair{0, 2}, std::pair{2, 4}, std::pair{4, 5}})
    micro.push_back({x.slice(0, from, to).contiguous(), y.slice(0, from, to).contiguous(), (to - from) / 5.0});
  dt::rng init(3, "init");
  dt::nn::gpt<dt::cpu> whole(cfg, init);
  whole.loss(x, y).backward();
  named_values grads(2);  // by rank: each peer writes its own
  std::vector<double> losses(2);
  dt::transport::in_process(2).run([&](dt::transport::in_process::endpoint& ep) {
    dt::collective::communicator<dt::transport::in_process::endpoint> comm(ep);
    dt::rng part_init(3, "init");
    dt::nn::gpt<dt::cpu> stage(cfg, part_init, dt::nn::part{ep.rank(), 2, {}});
    dt::compress::identity codec;
    const auto stats = ps::execute(p, ep.rank(), stage, comm, {0, 1}, micro, codec, true);
    for (const auto& e : stage.parameters()) grads[static_cast<std::size_t>(ep.rank())][e.name] = values(e.param.grad());
    losses[static_cast<std::size_t>(ep.rank())] = stats.loss;
  });
  // The tied embedding's halves are the caller's to add (the policy does): compare the rest.
  std::map<std::string, std::vector<float>> ref;
  for (const auto& e : whole.parameters())
    if (e.name != "wte.weight") ref[e.name] = values(e.param.grad());
  for (auto& g : grads) g.erase("wte.weight");
  const auto c = compare(grads, ref);
  CHECK(c.covered == ref.size());
  CHECK(c.worst <= 1e-6);
  CHECK(losses[1] == Approx(whole.loss(x, y).item()).epsilon(1e-6));
  CHECK(losses[0] == 0.0);
}

TEST_CASE("pipeline: one stage and one micro-batch is data parallelism, dropout included, bit for bit") {
  auto cfg = four_blocks();
  cfg.dropout = 0.2;  // training draws masks from each peer's stream; evaluations draw none
  auto opts = run_of(6, 4);
  opts.eval_every = 3;
  using Data = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::data>;
  using One = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::sync_allreduce<>, dt::parallel::pipeline<>>;
  std::vector<dt::train::fit_result> data_r, one_r;
  const auto data_p = fixture::final_params<Data>(2, cfg, opts, {}, &data_r);
  const auto one_p = fixture::final_params<One>(2, cfg, opts, {}, &one_r, piped(1, 1));
  CHECK(one_p == data_p);
  REQUIRE(one_r[0].evals.size() == data_r[0].evals.size());
  for (std::size_t i = 0; i < one_r[0].evals.size(); ++i) CHECK(one_r[0].evals[i].val_loss == data_r[0].evals[i].val_loss);
  CHECK(one_r[0].last.loss == data_r[0].last.loss);
}
