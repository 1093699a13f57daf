// Peers as the ranks of an MPI communicator (OpenMPI on a cluster, or mpirun on one machine).
// Compiled only when the build defines DECENTRAIN_HAS_MPI (the decentrain::mpi CMake target
// does, and links MPI). Sends are MPI_Isend from a private copy, so the caller may reuse its
// buffer at once and a ring of simultaneous sends cannot deadlock on MPI's rendezvous protocol;
// receives probe for (source, tag) so a message of any size can be taken, with a timeout. Under
// MPI_THREAD_MULTIPLE (what mpi_environment asks for) an endpoint offers a lane, so collectives
// started in the background progress on their own thread.
#pragma once

#include "decentrain/config.hpp"

#ifndef DECENTRAIN_HAS_MPI
#define DECENTRAIN_HAS_MPI 0
#endif

#if DECENTRAIN_HAS_MPI

#include <mpi.h>

#include <chrono>
#include <climits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::transport {

// Initialises MPI (if nobody has) for the lifetime of the object, and finalises what it began.
// It asks for MPI_THREAD_MULTIPLE, which background collectives need (with less, they run on the
// caller's thread); a program that wants MPI's single-threaded speed can ask for less.
class mpi_environment {
 public:
  mpi_environment(int* argc, char*** argv, int thread_level = MPI_THREAD_MULTIPLE) {
    int ready = 0;
    MPI_Initialized(&ready);
    if (!ready) {
      int provided = 0;
      MPI_Init_thread(argc, argv, thread_level, &provided);
      owner_ = true;
    }
  }
  ~mpi_environment() {
    int done = 0;
    MPI_Finalized(&done);
    if (owner_ && !done) MPI_Finalize();
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;

 private:
  bool owner_ = false;
};

class mpi {
 public:
  // Uses a duplicate of `comm`, so the library's tags never meet the application's messages.
  explicit mpi(MPI_Comm comm = MPI_COMM_WORLD, std::chrono::milliseconds recv_timeout = std::chrono::minutes(5))
      : self_(std::make_shared<state>()) {
    int ready = 0;
    MPI_Initialized(&ready);
    decentrain::detail::check(ready != 0, "mpi: MPI is not initialised (create a transport::mpi_environment first)");
    MPI_Comm_dup(comm, &self_->comm);
    MPI_Comm_rank(self_->comm, &self_->rank);
    MPI_Comm_size(self_->comm, &self_->world);
    void* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(self_->comm, MPI_TAG_UB, &ub, &found);
    self_->tag_modulus = found ? static_cast<tag_type>(*static_cast<int*>(ub)) + 1 : 32768;
    self_->recv_timeout = recv_timeout;
    self_->started = std::chrono::steady_clock::now();
  }

  // The first `world` ranks of `comm` as their own group; the other ranks get nothing. Every
  // rank of `comm` must call it (it is collective).
  static std::optional<mpi> first(int world, MPI_Comm comm = MPI_COMM_WORLD,
                                  std::chrono::milliseconds recv_timeout = std::chrono::minutes(5)) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    decentrain::detail::check(world >= 1 && world <= size, "mpi: cannot make a group of ", world, " from ", size, " ranks");
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm, rank < world ? 0 : MPI_UNDEFINED, rank, &sub);
    if (sub == MPI_COMM_NULL) return std::nullopt;
    mpi m(sub, recv_timeout);
    MPI_Comm_free(&sub);
    return m;
  }

  int rank() const { return self_->rank; }
  int world() const { return self_->world; }
  void computed(double) {}

  // A second endpoint over the same communicator for a background collective (different tags),
  // where MPI allows calls from several threads; its waits are not the caller's.
  std::optional<mpi> lane() {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) return std::nullopt;
    mpi l = *this;
    l.lane_ = true;
    return l;
  }

  void send(int peer, tag_type tag, std::span<const std::byte> data) {
    check_peer(peer, "send to");
    decentrain::detail::check(data.size() <= static_cast<std::size_t>(INT_MAX), "mpi: a message of ", data.size(),
                              " bytes is over MPI's int count");
    std::lock_guard lock(self_->mutex);
    self_->complete_sends(false);
    auto& p = self_->pending.emplace_back();
    p.buffer.assign(data.begin(), data.end());
    MPI_Isend(p.buffer.data(), static_cast<int>(p.buffer.size()), MPI_BYTE, peer, mpi_tag(tag), self_->comm, &p.request);
    self_->stats.bytes_sent += data.size();
    ++self_->stats.messages_sent;
  }

  bytes recv(int peer, tag_type tag) {
    const int sources[1] = {peer};
    return recv_any(sources, tag).data;
  }
  // Polls each source in turn (MPI_Iprobe), so that a message from a peer outside the set is
  // never taken; the first found is received.
  received recv_any(std::span<const int> sources, tag_type tag) {
    decentrain::detail::check(!sources.empty(), "mpi: peer ", self_->rank, " cannot receive from none of the peers");
    for (const int peer : sources) check_peer(peer, "receive from");
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + self_->recv_timeout;
    for (std::uint64_t spins = 0;; ++spins) {
      for (const int peer : sources)
        if (auto got = probed(peer, tag, t0)) return {peer, std::move(*got)};
      {
        std::lock_guard lock(self_->mutex);
        self_->complete_sends(false);
      }
      if (spins > 1000) {
        if (std::chrono::steady_clock::now() > deadline) {
          std::string list;
          for (const int peer : sources) list += (list.empty() ? "" : ", ") + std::to_string(peer);
          decentrain::detail::fail("transport: no message from ", sources.size() == 1 ? "peer " : "any of peers ", list,
                                   " (tag ", tag, ") within ", self_->recv_timeout.count(),
                                   " ms: the peer is slow, partitioned or has failed");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  std::optional<bytes> try_recv(int peer, tag_type tag) {
    check_peer(peer, "receive from");
    return probed(peer, tag, std::chrono::steady_clock::now());
  }

  traffic_stats stats() const {
    std::lock_guard lock(self_->mutex);
    auto s = self_->stats;
    s.clock_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - self_->started).count();
    return s;
  }

 private:
  // The next message from `peer` with `tag` if one is there (received, counted; the wait since
  // `t0` counted as the caller's), else none.
  std::optional<bytes> probed(int peer, tag_type tag, std::chrono::steady_clock::time_point t0) {
    MPI_Status status{};
    int ready = 0;
    MPI_Iprobe(peer, mpi_tag(tag), self_->comm, &ready, &status);
    if (!ready) return std::nullopt;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    bytes out(static_cast<std::size_t>(count));
    MPI_Recv(out.data(), count, MPI_BYTE, peer, mpi_tag(tag), self_->comm, MPI_STATUS_IGNORE);
    std::lock_guard lock(self_->mutex);
    if (!lane_) self_->stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    self_->stats.bytes_received += out.size();
    ++self_->stats.messages_received;
    return out;
  }
  struct pending_send {
    bytes buffer;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  struct state {
    ~state() {
      int ready = 0, done = 0;
      MPI_Initialized(&ready);
      MPI_Finalized(&done);
      if (!ready || done || comm == MPI_COMM_NULL) return;
      complete_sends(true);
      MPI_Comm_free(&comm);
    }
    void complete_sends(bool wait) {
      for (auto it = pending.begin(); it != pending.end();) {
        int finished = 0;
        if (wait)
          MPI_Wait(&it->request, MPI_STATUS_IGNORE), finished = 1;
        else
          MPI_Test(&it->request, &finished, MPI_STATUS_IGNORE);
        it = finished ? pending.erase(it) : std::next(it);
      }
    }
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, world = 1;
    tag_type tag_modulus = 32768;
    std::chrono::milliseconds recv_timeout{300000};
    std::chrono::steady_clock::time_point started;
    std::mutex mutex;  // pending and stats: a lane's thread sends and receives too
    std::list<pending_send> pending;
    traffic_stats stats;
  };

  // Collectives number their calls in a tag's low 32 bits and name their channel (a group, a
  // background lane) in the high ones. MPI tags are bounded, and messages between two ranks on
  // one communicator do not overtake each other, so wrapping the number around is safe; the
  // channel is mixed in by an odd multiplier so that channels do not land on the same tags.
  int mpi_tag(tag_type tag) const {
    const std::uint64_t mixed = (tag & 0xffffffffu) + (tag >> 32) * 0x9e3779b1u;
    return static_cast<int>(mixed % self_->tag_modulus);
  }

  void check_peer(int peer, const char* what) const {
    decentrain::detail::check(peer >= 0 && peer < world(), "mpi: peer ", rank(), " cannot ", what, " peer ", peer,
                              " (world of ", world(), ")");
  }

  std::shared_ptr<state> self_;
  bool lane_ = false;
};

static_assert(endpoint<mpi>);

}  // namespace decentrain::transport

#endif  // DECENTRAIN_HAS_MPI
