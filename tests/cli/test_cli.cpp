// decentrain-gpt end to end, as a user runs it: eval and --dump-grads against PyTorch's loss
// and gradients (fixture: tests/reference/make_fixtures.py; loss to 1e-5 relative, gradients
// to 1e-5 + 1e-4 relative), train/resume giving the uninterrupted result, Ctrl-C saving a
// checkpoint, and bad arguments.
#include "support/fixture.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {
struct result {
  int status;
  std::string output;
};
// Runs the CLI with `args` in `dir`, capturing stdout and stderr.
result run(const std::string& args, const fs::path& dir) {
  const auto out = dir / "output.txt";
  const std::string cmd = "cd '" + dir.string() + "' && " + args + " > '" + out.string() + "' 2>&1";
  const int raw = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream s;
  s << in.rdbuf();
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, s.str()};
}
std::string cli() { return std::string("'") + DECENTRAIN_GPT_EXE + "'"; }
fs::path scratch(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("decentrain_cli_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
std::string last_line_with(const std::string& text, const std::string& prefix) {
  std::string found, line;
  std::istringstream in(text);
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) found = line;
  return found;
}
}  // namespace

TEST_CASE("eval reproduces PyTorch's loss and gradients from safetensors weights", "[cli][parity]") {
  const auto dir = scratch("eval");
  const std::string fx_dir = DECENTRAIN_FIXTURE_DIR;
  const auto r = run(cli() + " eval --weights " + fx_dir + "/gpt_block.safetensors --tokens " + fx_dir +
                         "/eval_tokens.bin --n-head 2 --batch-size 2 --block-size 8 --dump-grads grads.safetensors",
                     dir);
  INFO(r.output);
  REQUIRE(r.status == 0);
  const fixture expected(fx_dir + "/eval.dtfx");
  const auto line = last_line_with(r.output, "loss ");
  REQUIRE_FALSE(line.empty());
  CHECK(std::stod(line.substr(5)) == Approx(expected["loss"].item()).epsilon(1e-5));
  const auto grads = dt::io::load_safetensors(dir / "grads.safetensors");
  CHECK(grads.size() == 28);
  for (const auto& [name, g] : grads) {
    INFO(name);
    const auto cmp = dt::compare(g, expected["grad." + name], 1e-4, 1e-5);
    INFO(cmp.message);
    CHECK(cmp.close);
  }
}

TEST_CASE("train, resume: the resumed run ends where the uninterrupted one does", "[cli][train]") {
  const auto dir = scratch("resume");
  const std::string common = cli() + " train --steps 40 --save-every 20 --eval-every 20 --eval-batches 2 "
                                     "--batch-size 4 --block-size 16 --dropout 0.1 --metrics ''";
  const auto straight = run(common + " --checkpoint-dir a --keep-checkpoints", dir);
  INFO(straight.output);
  REQUIRE(straight.status == 0);
  REQUIRE(fs::exists(dir / "a" / "step-20.ckpt"));
  // Start a second run from the first one's step-20 checkpoint, as if it had stopped there.
  fs::create_directories(dir / "b");
  fs::copy_file(dir / "a" / "step-20.ckpt", dir / "b" / "latest.ckpt");
  const auto resumed = run(common + " --checkpoint-dir b --resume", dir);
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.output, Contains("resumed from b/latest.ckpt at step 20"));
  CHECK(last_line_with(resumed.output, "val loss") == last_line_with(straight.output, "val loss"));
  const auto a = dt::io::load_checkpoint(dir / "a" / "latest.ckpt"), b = dt::io::load_checkpoint(dir / "b" / "latest.ckpt");
  CHECK(a.counter("step") == 40);
  for (const auto& [name, t] : a.tensors) {
    INFO(name);
    CHECK(dt::allclose(t, b.tensor_at(name), 0.0, 0.0));  // bit for bit
  }
}

TEST_CASE("Ctrl-C saves a checkpoint that training resumes from", "[cli][train]") {
  const auto dir = scratch("interrupt");
  const auto r = run("timeout --preserve-status -s INT 3 " + cli() +
                         " train --steps 1000000 --batch-size 4 --block-size 16 --metrics '' --checkpoint-dir ck",
                     dir);
  INFO(r.output);
  CHECK(r.status == 130);
  CHECK_THAT(r.output, Contains("checkpoint saved to ck/latest.ckpt"));
  REQUIRE(fs::exists(dir / "ck" / "latest.ckpt"));
  const auto step = dt::io::load_checkpoint(dir / "ck" / "latest.ckpt").counter("step");
  CHECK(step > 0);
  const auto resumed = run(cli() + " train --steps " + std::to_string(step + 5) +
                               " --batch-size 4 --block-size 16 --metrics '' --checkpoint-dir ck --resume --eval-batches 1",
                           dir);
  INFO(resumed.output);
  CHECK(resumed.status == 0);
  CHECK_THAT(resumed.output, Contains("resumed from ck/latest.ckpt at step " + std::to_string(step)));
}

TEST_CASE("train --compute-dtype bf16: mixed precision lands near the f32 run", "[cli][train]") {
  const auto dir = scratch("mixed");
  const std::string common = cli() + " train --steps 40 --eval-every 40 --eval-batches 4";
  const auto f32 = run(common + " --metrics f32.jsonl", dir), bf16 = run(common + " --metrics bf16.jsonl --compute-dtype bf16", dir);
  REQUIRE(f32.status == 0);
  REQUIRE(bf16.status == 0);
  const auto val = [](const std::string& out) { return std::stod(out.substr(out.rfind("val loss ") + 9)); };
  // The last step's gradient norm (6 digits in the metrics): bf16 arithmetic really ran. The
  // losses are f32 in both runs and may agree to the 4 printed digits after 40 steps.
  const auto last_grad_norm = [&](const std::string& file) {
    std::ifstream in(dir / file);
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str(), key = "\"grad_norm\":";
    const auto at = all.rfind(key);
    REQUIRE(at != std::string::npos);
    return std::stod(all.substr(at + key.size()));
  };
  INFO("f32 " << val(f32.output) << ", bf16 " << val(bf16.output));
  CHECK(last_grad_norm("bf16.jsonl") != last_grad_norm("f32.jsonl"));
  CHECK(last_grad_norm("bf16.jsonl") == Approx(last_grad_norm("f32.jsonl")).epsilon(0.03));
  CHECK(val(bf16.output) == Approx(val(f32.output)).epsilon(0.03));
}

TEST_CASE("bad arguments and files are reported, not crashed on", "[cli][errors]") {
  const auto dir = scratch("errors");
  auto r = run(cli() + " train --steps 0", dir);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, Contains("must be positive"));
  r = run(cli() + " train --stepz 10", dir);
  CHECK_THAT(r.output, Contains("unknown option --stepz"));
  r = run(cli() + " train --preset huge", dir);
  CHECK_THAT(r.output, Contains("unknown model preset 'huge'"));
  r = run(cli() + " train --data missing.txt", dir);
  CHECK_THAT(r.output, Contains("cannot open missing.txt"));
  r = run(cli() + " train --steps 5 --compute-dtype f16", dir);
  CHECK_THAT(r.output, Contains("--compute-dtype must be f32 or bf16, got 'f16'"));
  r = run(cli() + " eval --weights missing.safetensors --tokens x --n-head 2", dir);
  CHECK_THAT(r.output, Contains("cannot open missing.safetensors"));
  r = run(cli() + " frobnicate", dir);
  CHECK(r.status == 2);
  CHECK_THAT(r.output, Contains("unknown command 'frobnicate'"));
  r = run(cli() + " help", dir);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, Contains("--dump-grads"));
}

namespace {
std::uint16_t free_port() {
  asio::io_context io;
  asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}
const std::string peer_args =
    " train --comm diloco --inner-steps 5 --steps 12 --batch-size 4 --eval-batches 2 --eval-every 100 --threads 1"
    " --n-layer 1 --n-embd 32 --n-head 2 --block-size 16 --seed 7";
}  // namespace

TEST_CASE("train: in-process, TCP and MPI peers finish and agree", "[cli][peers]") {
  const auto dir = scratch("peers");
  const auto in_process = run(cli() + peer_args + " --peers 2 --link wan", dir);
  INFO(in_process.output);
  REQUIRE(in_process.status == 0);
  const auto expected = last_line_with(in_process.output, "val loss ");
  REQUIRE(!expected.empty());
  CHECK(in_process.output.find("comm diloco:") != std::string::npos);

  // Two processes on loopback; `timeout` makes sure neither outlives the test.
  const auto port = std::to_string(free_port());
  const auto tcp = run("( (timeout 120 " + cli() + peer_args + " --listen 127.0.0.1:0 --join 127.0.0.1:" + port +
                           " --rank 1 --world 2 > rank1.txt 2>&1 &) ; timeout 120 " + cli() + peer_args +
                           " --listen 127.0.0.1:" + port + " --rank 0 --world 2; status=$?; wait; exit $status )",
                       dir);
  INFO(tcp.output);
  CHECK(tcp.status == 0);
  // Same algorithms, same order of sums, one thread each: the same number to the last digit.
  CHECK(last_line_with(tcp.output, "val loss ") == expected);

#if defined(DECENTRAIN_MPIRUN)
  const auto mpi = run("timeout 120 " DECENTRAIN_MPIRUN " --allow-run-as-root --oversubscribe -np 2 " + cli() + peer_args + " --mpi", dir);
  INFO(mpi.output);
  CHECK(mpi.status == 0);
  CHECK(last_line_with(mpi.output, "val loss ") == expected);
#endif

  // Every peer checkpoints itself; resuming all of them from the step-8 files (mid-round for
  // H = 5) ends exactly where the uninterrupted run does.
  const auto saving = run(cli() + peer_args + " --peers 2 --link wan --checkpoint-dir ck --save-every 4 --keep-checkpoints", dir);
  INFO(saving.output);
  REQUIRE(saving.status == 0);
  CHECK(last_line_with(saving.output, "val loss ") == expected);
  fs::create_directories(dir / "ck2");
  for (const char* f : {"peer-0-of-2.ckpt", "peer-1-of-2.ckpt"}) fs::copy_file(dir / "ck" / "step-8" / f, dir / "ck2" / f);
  const auto resumed = run(cli() + peer_args + " --peers 2 --link wan --checkpoint-dir ck2 --resume", dir);
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.output, Contains("peer 1 resumed from ck2/peer-1-of-2.ckpt at step 8"));
  CHECK(last_line_with(resumed.output, "val loss ") == expected);
  const auto none = run(cli() + peer_args + " --peers 2 --checkpoint-dir empty --resume", dir);
  CHECK(none.status == 1);
  CHECK_THAT(none.output, Contains("no peer checkpoints (peer-R-of-W.ckpt) in empty"));

  const auto bad = run(cli() + " train --peers 2 --comm gossip", dir);
  CHECK(bad.status == 1);
  CHECK(bad.output.find("--comm must be sync, local-sgd or diloco, got 'gossip'") != std::string::npos);
  const auto lonely = run("timeout 60 " + cli() + " train --listen 127.0.0.1:0 --rank 1 --world 2", dir);
  CHECK(lonely.status == 1);
  CHECK(lonely.output.find("needs at least one peer to join through") != std::string::npos);
}
