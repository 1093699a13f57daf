// Checkpoints every `every` steps: each peer writes its whole state (model, optimizer, step,
// dropout stream, the communication policy's state) to dir/peer-R-of-W/step-N.ckpt, atomically
// (a crash mid-write leaves the previous files whole), keeping the newest `keep_last`. The state
// is captured at the step; encoding and writing it happen on a background thread while training
// goes on (one write at a time; the last step's and a stop's are waited for). With `resume`,
// start() picks the newest step that every peer holds intact (its file reads back whole): when
// one peer was killed while saving, or a file was damaged since, every peer falls back to the
// same older step instead of refusing to start, and unreadable() says which files were passed over.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "decentrain/collective/communicator.hpp"
#include "decentrain/detail/error.hpp"
#include "decentrain/fault/policy.hpp"
#include "decentrain/io/atomic_file.hpp"
#include "decentrain/io/background_writer.hpp"
#include "decentrain/io/checkpoint.hpp"

namespace decentrain::fault {

struct checkpoint_every {
  using policy_concept = policy_tag;
  static constexpr const char* name = "checkpoint_every";

  std::string dir;             // where each peer's folder goes (required)
  std::int64_t every = 500;    // steps between checkpoints (and one after the last step); 0: only on_stop
  int keep_last = 2;           // newest checkpoints kept per peer; 2 or more lets a peer fall back one
  bool resume = true;          // start from the newest step that every peer has, if any
  bool background = true;      // write on a thread of its own while training goes on
  std::map<std::string, std::string> text;  // stored in every checkpoint (a tokenizer, say)

  // Where peer `rank` of `world` keeps its checkpoints.
  std::filesystem::path peer_dir(int rank, int world) const {
    return std::filesystem::path(dir) / ("peer-" + std::to_string(rank) + "-of-" + std::to_string(world));
  }
  std::filesystem::path file(int rank, int world, std::int64_t step) const {
    return peer_dir(rank, world) / ("step-" + std::to_string(step) + ".ckpt");
  }
  // The steps this peer has checkpoints of, ascending.
  std::vector<std::int64_t> saved_steps(int rank, int world) const {
    std::vector<std::int64_t> steps;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(peer_dir(rank, world), ec)) {
      const auto n = e.path().filename().string();
      if (n.rfind("step-", 0) != 0 || e.path().extension() != ".ckpt") continue;
      const auto digits = n.substr(5, n.size() - 10);
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      steps.push_back(std::stoll(digits));
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  // Checks the settings and makes peer `rank` of `world` ready to save: the writer thread, and
  // no temporary file of a write that a crash cut short (the finished files are whole).
  void open(int rank, int world) {
    wait();  // a write a failed fit() left in flight finishes before its .tmp could be taken for a torn one
    unreadable_.clear();
    decentrain::detail::check(!dir.empty(), "checkpoint_every: dir is empty (where should checkpoints go?)");
    decentrain::detail::check(every >= 0, "checkpoint_every: every must be >= 0, got ", every);
    decentrain::detail::check(keep_last >= 1, "checkpoint_every: keep_last must be >= 1, got ", keep_last);
    if (background && !writer_.get) writer_.get = std::make_shared<io::background_writer>();
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(peer_dir(rank, world), ec))
      if (e.path().extension() == ".tmp") std::filesystem::remove(e.path(), ec);
  }

  template <class Ctx>
  void start(Ctx& ctx) {
    const int rank = ctx.comm.rank(), world = ctx.comm.world();
    open(rank, world);
    if (!resume) return;
    const auto mine = saved_steps(rank, world);
    // The newest step every peer holds intact: each peer offers its newest intact step at or
    // below a bound, and the bound falls to the least offer until every peer offers the same
    // (one all-reduce a round; a step above the answer lacks an intact file on some peer, so the
    // answer is the newest step intact everywhere, and every peer reaches it alike).
    std::optional<std::pair<std::int64_t, io::checkpoint>> offer;
    std::int64_t bound = std::numeric_limits<std::int64_t>::max();
    for (;;) {
      if (!offer || offer->first > bound) offer = newest_intact(rank, world, bound);
      const std::int64_t step = offer ? offer->first : -1, has = mine.empty() ? 0 : 1;
      // the newest offer, -(the least offer), whether any peer has files, -(whether every peer has)
      std::int64_t agreed[4] = {step, -step, has, -has};
      ctx.comm.all_reduce(std::span<std::int64_t>(agreed, 4), collective::reduce_op::max);
      const std::int64_t most = agreed[0], least = -agreed[1];
      if (agreed[2] == 0) return;  // a fresh run
      decentrain::detail::check(agreed[3] == -1, "checkpoint_every: some peers have checkpoints in ", dir,
                                " and others have none (as peer ", rank, " sees ", dir, ": ", who_has(world),
                                "); resume needs every peer's, or start with an empty directory");
      decentrain::detail::check(least >= 0, "checkpoint_every: no step has a checkpoint that reads back whole on every peer (peer ",
                                rank, " has ", describe(mine), " in ", peer_dir(rank, world).string(), describe(unreadable_), ")");
      if (most == least) break;
      bound = least;
    }
    ctx.restore(offer->second);
    // Newer files belong to the run that was abandoned: drop them, so they neither count
    // towards keep_last nor look like a step every peer has the next time.
    for (auto s : mine)
      if (s > offer->first) std::filesystem::remove(file(rank, world, s));
  }

  // This peer's newest checkpoint of a step at most `bound` that reads back whole, loaded, or none;
  // the newer ones that do not are noted in unreadable().
  std::optional<std::pair<std::int64_t, io::checkpoint>> newest_intact(int rank, int world,
                                                                       std::int64_t bound = std::numeric_limits<std::int64_t>::max()) {
    const auto steps = saved_steps(rank, world);
    for (auto s = steps.rbegin(); s != steps.rend(); ++s) {
      if (*s > bound || unreadable_.contains(*s)) continue;
      try {
        return std::pair{*s, io::load_checkpoint(file(rank, world, *s))};
      } catch (const decentrain::error& e) {
        unreadable_[*s] = e.what();
      }
    }
    return std::nullopt;
  }
  // The checkpoints of this peer that start() passed over because they did not read back whole
  // (a damaged or cut-off file), by step, each with the error.
  const std::map<std::int64_t, std::string>& unreadable() const { return unreadable_; }

  template <class Ctx>
  void after_step(Ctx& ctx) {
    if (due(ctx)) save(ctx);
  }
  // Whether after_step saves now: every `every` steps and after the last.
  template <class Ctx>
  bool due(const Ctx& ctx) const {
    return every > 0 && (ctx.steps_done % every == 0 || ctx.last_step);
  }

  template <class Ctx>
  action on_error(Ctx&, const transport::peer_error&) {
    return action::rethrow;
  }

  template <class Ctx>
  void on_stop(Ctx& ctx) {
    save(ctx);
    wait();
  }

  // Captures this peer's state now and writes it (in the background, unless it is the last
  // step's), dropping checkpoints beyond keep_last; returns the file.
  template <class Ctx>
  std::filesystem::path save(Ctx& ctx) {
    return save_as(ctx, ctx.comm.rank(), ctx.comm.world());
  }
  // The same into peer `rank` of `world`'s folder (an elastic group's communicator is its view's).
  template <class Ctx>
  std::filesystem::path save_as(Ctx& ctx, int rank, int world) {
    wait();  // before the capture: one captured state at a time beside the model
    auto c = std::make_shared<io::checkpoint>(ctx.capture());
    for (const auto& [k, v] : text) c->text[k] = v;
    c->counters["trainer.rank"] = rank;  // not the view's rank: the peer restarts in the whole world
    c->counters["trainer.world"] = world;
    const auto path = file(rank, world, ctx.steps_done);
    checkpoint_every where;  // the folder settings, by value: the writer outlives nothing of this
    where.dir = dir;
    where.keep_last = keep_last;
    auto write = [where, c, path, rank, world] {
      io::make_folder(where.peer_dir(rank, world));
      io::save_checkpoint(path, *c);
      auto steps = where.saved_steps(rank, world);
      for (std::size_t i = 0; i + static_cast<std::size_t>(where.keep_last) < steps.size(); ++i)
        std::filesystem::remove(where.file(rank, world, steps[i]));
    };
    if (writer_.get) writer_.get->submit(std::move(write));
    else write();
    if (ctx.last_step) wait();
    return path;
  }
  // Returns once the write in flight is on disk; rethrows its error.
  void wait() {
    if (writer_.get) writer_.get->wait();
  }

 private:
  // Which peers of a run of `world` have checkpoints in dir (machines that share no directory
  // each see their own): "peers 0, 1 have some, 2, 3 have none".
  std::string who_has(int world) const {
    std::string have, lack;
    int listed = 0;
    for (int r = 0; r < world; ++r) {
      auto& list = saved_steps(r, world).empty() ? lack : have;
      if (++listed > 64) {  // a world of thousands: enough to see the pattern
        list += ", ...";
        break;
      }
      list += (list.empty() ? "" : ", ") + std::to_string(r);
    }
    return "peers " + (have.empty() ? std::string("none") : have) + " have some, " + (lack.empty() ? std::string("none") : lack) +
           " have none";
  }

  static std::string describe(const std::map<std::int64_t, std::string>& unreadable) {
    std::string s;
    for (const auto& [step, why] : unreadable) s += decentrain::detail::concat("; step ", step, " does not read back: ", why);
    return s;
  }
  static std::string describe(const std::vector<std::int64_t>& steps) {
    if (steps.empty()) return "none";
    std::string s = "steps";
    for (auto v : steps) {
      s += ' ';
      s += std::to_string(v);
    }
    return s;
  }

  // From open(). A copy of the policy starts without one (its own open() makes it), so two
  // trainers given copies of one started policy never share a writer.
  struct own_writer {
    std::shared_ptr<io::background_writer> get;
    own_writer() = default;
    own_writer(const own_writer&) {}
    own_writer& operator=(const own_writer&) { return *this; }
    own_writer(own_writer&&) noexcept = default;
    own_writer& operator=(own_writer&&) noexcept = default;
  } writer_;
  std::map<std::int64_t, std::string> unreadable_;
};

}  // namespace decentrain::fault
