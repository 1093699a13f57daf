// Runs one function on N peers of a given transport, each peer on its own thread, so the same
// conformance tests can be instantiated for every transport (TEMPLATE_TEST_CASE).
#pragma once

#include <decentrain/collective/communicator.hpp>
#include <decentrain/transport/in_process.hpp>
#include <decentrain/transport/mpi.hpp>
#include <decentrain/transport/tcp.hpp>

#include <chrono>
#include <climits>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace harness {

// Each harness runs fn(endpoint) for every peer of N it hosts in this process
// (`local_peers(n)`: all of them, or under MPI this process's rank alone).
struct in_process {
  static constexpr const char* name = "in_process";
  static int local_peers(int n) { return n; }
  template <class Fn>
  static void run(int n, Fn fn) {
    decentrain::transport::in_process::options o;
    o.seed = 7;
    o.recv_timeout = std::chrono::milliseconds(20000);
    decentrain::transport::in_process net(decentrain::transport::links::lan(n), o);
    net.run([&](decentrain::transport::in_process::endpoint& ep) { fn(ep); });
  }
};

// N TCP peers on 127.0.0.1, one thread each; rank 0 binds first so the others can join it.
struct tcp {
  static constexpr const char* name = "tcp";
  static int local_peers(int n) { return n; }
  template <class Fn>
  static void run(int n, Fn fn) {
    for (auto& e : run_each(n, [](decentrain::transport::tcp_options&) {}, fn))
      if (e) std::rethrow_exception(e);
  }
  // The same, each peer's options changed by adjust(options) (the rank and world already set),
  // and what each peer threw (null: nothing) returned rather than rethrown.
  template <class Adjust, class Fn>
  static std::vector<std::exception_ptr> run_each(int n, Adjust adjust, Fn fn) {
    namespace tr = decentrain::transport;
    auto options = [&](int r) {
      tr::tcp_options o;
      o.rank = r;
      o.world = n;
      o.join_timeout = std::chrono::milliseconds(20000);
      o.recv_timeout = std::chrono::milliseconds(20000);
      adjust(o);
      return o;
    };
    tr::tcp first(options(0));
    const std::string seed = first.address();
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          std::optional<tr::tcp> ep;
          if (r == 0) {
            ep.emplace(std::move(first));  // so a failing rank 0 closes its connections
          } else {
            auto o = options(r);
            o.join = {seed};
            ep.emplace(o);
          }
          ep->connect();
          fn(*ep);
          // Everyone finishes before anyone disconnects (a late peer would see the others gone).
          decentrain::collective::communicator<tr::tcp>(*ep).barrier();
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    return errors;
  }
  // What an exception_ptr holds, as text ("" for none).
  static std::string what(const std::exception_ptr& e) {
    if (!e) return "";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    } catch (...) {
      return "(not a std::exception)";
    }
  }
};

// TCP with every message of 4 KiB or more striped over three connections a pair in pieces of
// 4 KiB (tcp_options::streams): the same cases through the receiving side's reassembly. Each peer
// starts a case once it has its three to every other (an acceptor registers them as they come).
struct tcp_striped {
  static constexpr const char* name = "tcp_striped";
  static int local_peers(int n) { return n; }
  template <class Fn>
  static void run(int n, Fn fn) {
    namespace tr = decentrain::transport;
    const auto striped = [](tr::tcp_options& o) {
      o.streams = 3;
      o.stripe_min_bytes = 4096;
      o.stripe_piece_bytes = 4096;
    };
    for (auto& e : tcp::run_each(n, striped, [&](tr::tcp& ep) {
           const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
           for (int p = 0; p < ep.world(); ++p)
             while (p != ep.rank() && ep.streams_to(p) < 3 && std::chrono::steady_clock::now() < until)
               std::this_thread::sleep_for(std::chrono::milliseconds(2));
           for (int p = 0; p < ep.world(); ++p)
             if (p != ep.rank() && ep.streams_to(p) != 3)
               decentrain::detail::fail("harness::tcp_striped: peer ", ep.rank(), " has ", ep.streams_to(p), " streams to peer ", p);
           fn(ep);  // (each peer stripes what it sends once it has its streams: no barrier, whose messages the cases would count)
         }))
      if (e) std::rethrow_exception(e);
  }
};

#if DECENTRAIN_HAS_MPI
// The first N ranks of MPI_COMM_WORLD (the test runs under mpirun -np 8). A failure on any rank
// is rethrown on every rank, so an expected error is seen everywhere.
struct mpi {
  static constexpr const char* name = "mpi";
  static int local_peers(int n) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank < n ? 1 : 0;
  }
  template <class Fn>
  static void run(int n, Fn fn) {
    namespace tr = decentrain::transport;
    std::string error;
    {
      auto ep = tr::mpi::first(n, MPI_COMM_WORLD, std::chrono::milliseconds(5000));
      if (ep) {
        try {
          fn(*ep);
        } catch (const std::exception& e) {
          error = e.what();
          if (error.empty()) error = "(empty error)";
        }
      }
    }
    int rank = 0, failed_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int mine = error.empty() ? INT_MAX : rank;
    // Bounded: a rank still in the case after 120 s (one that hangs) ends the run naming the wait,
    // rather than leaving the others in the all-reduce until CTest's timeout.
    MPI_Request request;
    MPI_Iallreduce(&mine, &failed_rank, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &request);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (int done = 0; !done;) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "harness::mpi: rank %d finished the case and waited 120 s for the others: one hangs\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (failed_rank == INT_MAX) return;
    int length = static_cast<int>(error.size());
    MPI_Bcast(&length, 1, MPI_INT, failed_rank, MPI_COMM_WORLD);
    error.resize(static_cast<std::size_t>(length));
    MPI_Bcast(error.data(), length, MPI_CHAR, failed_rank, MPI_COMM_WORLD);
    throw decentrain::error(error);
  }
};
#endif

}  // namespace harness

#ifndef TRANSPORTS
#define TRANSPORTS harness::in_process, harness::tcp, harness::tcp_striped
#endif
