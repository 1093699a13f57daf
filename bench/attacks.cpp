// bench/attacks: members that hold the run key and lie, against live TCP peers on 127.0.0.1.
// Each row is one attack, what it did to the honest peers, and the bound they must stay within:
//   flood     a member sends --flood-frames frames of 16 MiB on a tag nobody reads (before the
//             budgets, 40 of 64 MiB raised an honest peer from 25 to 2,586 MB): the receiver's
//             resident memory while it holds them (<= 100 MB over its start), and that a receive
//             the flood stalls names the member and the member is heard again afterwards;
//   joiners   --joiners processes' worth of fake joiners, each completing the keyed handshake and
//             holding its connection: connections and descriptors the peer holds (<= 64 over its
//             start), and that the pair of members still exchanges messages;
//   insider   one of 4 peers under fault::elastic sends every membership and data message type
//             after each of its steps, half well-formed and in range, the rest random
//             (bench/random_insider.hpp), for --seconds: honest peers stopped (0), steps, whether
//             they end equal, views, and the process's memory growth.
// The attackers are the library's own handshake with frames of their choosing (hostile_peer.hpp).
//
//   bench_attacks [--seconds 600] [--flood-frames 160] [--joiners 1000] [--seed 1] [--json PATH]
#include <asio.hpp>

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "decentrain/decentrain.hpp"
#include "args.hpp"
#include "hostile_peer.hpp"
#include "output_file.hpp"
#include "random_insider.hpp"

namespace dt = decentrain;
namespace tr = dt::transport;
namespace wire = dt::transport::wire;
using namespace std::chrono_literals;

namespace {

const std::string run_key = "bench/attacks: a run key all members hold";

tr::tcp_options keyed(int rank, int world) { return bench::keyed_options(run_key, rank, world); }

int open_descriptors() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n - 3;  // ".", ".." and the one opendir holds
}

struct row {
  std::string attack, measured, bound;
  bool held = false;
  double seconds = 0;
};

// A member floods a tag nobody reads; the honest peer then waits for a message queued behind it.
// The attacker is a child process, so that this process's memory is the honest peer's alone.
row flood(int frames) {
  row r{"flood", "", "RSS <= +100 MB; the stalled receive names the member; it is heard again"};
  const auto t0 = std::chrono::steady_clock::now();
  auto o = keyed(0, 2);
  o.budget_grace = 1000ms;
  tr::tcp peer(o);
  const auto address = peer.address();
  const double rss0 = bench::random_insider::rss_mb();
  const pid_t child = ::fork();
  dt::detail::check(child >= 0, "fork failed");
  if (child == 0) {  // the attacker: frames of 16 MiB (the largest a peer reads is 64 MiB)
    int code = 1;
    try {
      asio::io_context io;
      bench::hostile_peer h(io, address, keyed(1, 2), wire::hello_purpose::data, false, 60s);
      if (h.answer()) {
        const tr::bytes frame(16 << 20, std::byte{0x66});
        for (int i = 0; i < frames && !h.broken(); ++i) h.send(999, frame);
        h.send(7, tr::bytes(8, std::byte{7}));
        h.send(8, tr::bytes(8, std::byte{8}));
        (void)h.closed_by_peer(100000);
        code = 0;
      }
    } catch (...) {
    }
    ::_exit(code);
  }
  peer.connect();
  // Peak memory, sampled while the flood lasts.
  std::atomic<bool> done{false};
  std::atomic<double> peak{rss0};
  std::thread sampler([&] {
    for (; !done; std::this_thread::sleep_for(20ms)) peak = std::max(peak.load(), bench::random_insider::rss_mb());
  });
  // Each receive the flood stalls names the member over budget and drops what it queued; the
  // member's reading then resumes, and the next receive waits behind the rest of the flood.
  std::string stalled;
  bool heard_again = false;
  int stalls = 0, named_over_budget = 0;
  for (int tries = 0; tries < frames / 4 + 4 && !heard_again; ++tries) {
    try {
      heard_again = peer.recv(1, 7) == tr::bytes(8, std::byte{7}) && peer.recv(1, 8) == tr::bytes(8, std::byte{8});
    } catch (const tr::peer_error& e) {
      if (stalled.empty()) stalled = e.what();
      ++stalls;
      named_over_budget += std::string(e.what()).find("over its budget") != std::string::npos && e.peer() == 1;
    }
  }
  done = true;
  sampler.join();
  const double rss_held = peak;
  peer.forget(1);
  int status = 0;
  ::waitpid(child, &status, 0);
  const double growth = rss_held - rss0;
  const bool named = stalls > 0 && named_over_budget == stalls;
  r.held = growth <= 100 && named && heard_again;
  r.measured = dt::detail::concat(frames, " x 16 MiB sent; peak RSS +", static_cast<int>(growth), " MB; ", stalls,
                                  " receives stalled, ", named ? "each naming it over budget" : "not all named (first: " + stalled + ")",
                                  "; heard again: ", heard_again ? "yes" : "no");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Fake joiners by the hundred, each holding its connection open.
row joiners(int count) {
  row r{"joiners", "", "descriptors <= +64; the members still talk"};
  const auto t0 = std::chrono::steady_clock::now();
  auto o0 = keyed(0, 2), o1 = keyed(1, 2);
  o0.max_world = o1.max_world = count + 2;
  tr::tcp peer0(o0);
  o1.join = {peer0.address()};
  auto one = std::async(std::launch::async, [&] { return tr::tcp::join(o1); });
  peer0.connect();
  tr::tcp peer1 = one.get();
  const int fds0 = open_descriptors();
  asio::io_context io;
  std::vector<std::unique_ptr<bench::hostile_peer>> fakes;
  int most_fds = 0;
  std::size_t most_connected = 0, welcomed = 0;
  for (int rank = 2; rank < count + 2; ++rank) {
    auto h = std::make_unique<bench::hostile_peer>(io, peer0.address(), keyed(rank, 2), wire::hello_purpose::data, true, 300ms);
    const auto a = h->answer();
    if (a && a->head.type == wire::frame_type::welcome) ++welcomed;
    fakes.push_back(std::move(h));
    most_connected = std::max(most_connected, peer0.connected().size());
  }
  // Descriptors this process holds beyond the start, less the fakes' own sockets: the peer's.
  most_fds = open_descriptors() - fds0 - static_cast<int>(fakes.size());
  auto echo = std::async(std::launch::async, [&] { peer1.send(0, 31, peer1.recv(0, 31)); });
  const tr::bytes hello(100, std::byte{7});
  peer0.send(1, 31, hello);
  const bool talk = peer0.recv(1, 31) == hello;
  echo.get();
  fakes.clear();
  r.held = most_fds <= 64 && talk;
  r.measured = dt::detail::concat(count, " fake joiners: ", welcomed, " welcomed, at most ", most_connected,
                                  " connected peers, peer descriptors +", most_fds, "; members talk: ", talk ? "yes" : "no");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

row insider(std::chrono::seconds duration, std::uint64_t seed) {
  row r{"insider", "", "no honest peer stops; they end equal; RSS <= 3 x 68 + 64 MB"};
  bench::random_insider::settings s;
  s.duration = duration;
  s.seed = seed;
  // The tests' model: one layer, width 32, block 16, on the built-in corpus.
  const auto text = dt::data::builtin_corpus(std::size_t{1} << 16, 5);
  const auto tok = dt::data::char_tokenizer::from_text(text);
  const dt::data::token_dataset data(tok.encode(text));
  auto model = dt::nn::gpt_preset("tiny");
  model.vocab_size = tok.vocab_size();
  model.block_size = 16;
  model.n_layer = 1;
  model.n_embd = 32;
  model.n_head = 2;
  const auto out = bench::random_insider::run<dt::comm::sync_allreduce<>>(model, data, s);
  std::int64_t total = 0, stopped = 0, least_steps = -1;
  for (const auto& [what, n] : out.sent) total += n;
  for (std::size_t i = 0; i < out.honest_errors.size(); ++i) {
    if (!out.honest_errors[i].empty()) {
      ++stopped;
      std::fprintf(stderr, "honest peer %zu stopped: %s\n", i, out.honest_errors[i].c_str());
    }
    if (least_steps < 0 || out.honest_steps[i] < least_steps) least_steps = out.honest_steps[i];
  }
  const double growth = out.rss_peak_mb - out.rss_start_mb;
  r.held = stopped == 0 && out.honest_equal() && growth <= 3 * 68 + 64;
  r.measured = dt::detail::concat(total, " messages (", out.well_formed, " well-formed) over ", static_cast<int>(out.seconds), " s; ",
                                  stopped, " honest peers stopped, at least ", least_steps, " steps each, equal: ",
                                  out.honest_equal() ? "yes" : "no", "; ", out.views, " views, liar back ", out.liar_returns,
                                  " times; RSS +", static_cast<int>(growth), " MB");
  r.seconds = out.seconds;
  return r;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) try {
  bench::args a(argc, argv, "usage: bench_attacks [--seconds 600] [--flood-frames 160] [--joiners 1000] [--seed 1] [--json PATH]");
  const auto seconds = std::stoll(a.value("seconds", "600"));
  const int frames = std::stoi(a.value("flood-frames", "160"));
  const int count = std::stoi(a.value("joiners", "1000"));
  const auto seed = std::stoull(a.value("seed", "1"));
  const std::string json_path = a.value("json", "bench/results/attacks.json");
  a.finish();
  dt::detail::check(seconds >= 1 && frames >= 1 && count >= 1, "--seconds, --flood-frames and --joiners must be >= 1");
  bench::output_file json(json_path);

  std::vector<row> rows;
  std::fprintf(stderr, "flood: %d frames of 16 MiB ...\n", frames);
  rows.push_back(flood(frames));
  std::fprintf(stderr, "joiners: %d ...\n", count);
  rows.push_back(joiners(count));
  std::fprintf(stderr, "insider: %lld s ...\n", static_cast<long long>(seconds));
  rows.push_back(insider(std::chrono::seconds(seconds), seed));

  std::printf("%-8s %-5s %8s  %s\n%-8s %-5s %8s  %s\n", "attack", "held", "seconds", "measured", "", "", "", "bound");
  json << "[\n";
  bool all = true;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    all = all && r.held;
    std::printf("%-8s %-5s %8.1f  %s\n%-8s %-5s %8s  %s\n", r.attack.c_str(), r.held ? "yes" : "NO", r.seconds, r.measured.c_str(), "", "",
                "", r.bound.c_str());
    json << "  {\"attack\": " << quoted(r.attack) << ", \"held\": " << (r.held ? "true" : "false") << ", \"seconds\": " << r.seconds
         << ", \"measured\": " << quoted(r.measured) << ", \"bound\": " << quoted(r.bound) << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  json << "]\n";
  json.close();
  std::printf("rows written to %s\n", json_path.c_str());
  return all ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_attacks: %s\n", e.what());
  return 2;
}
