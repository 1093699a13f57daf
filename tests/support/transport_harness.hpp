// Runs one function on N peers of a given transport, each peer on its own thread, so the same
// conformance tests can be instantiated for every transport (TEMPLATE_TEST_CASE).
#pragma once

#include <decentrain/collective/communicator.hpp>
#include <decentrain/transport/in_process.hpp>

#include <functional>
#include <string>

#include <decentrain/transport/tcp.hpp>

#include <optional>
#include <thread>
#include <vector>

namespace harness {

struct in_process {
  static constexpr const char* name = "in_process";
  template <class Fn>
  static void run(int n, Fn fn) {
    decentrain::transport::in_process net(decentrain::transport::links::lan(n), {7, std::chrono::milliseconds(20000)});
    net.run([&](decentrain::transport::in_process::endpoint& ep) { fn(ep); });
  }
};

// N TCP peers on 127.0.0.1, one thread each; rank 0 binds first so the others can join it.
struct tcp {
  static constexpr const char* name = "tcp";
  template <class Fn>
  static void run(int n, Fn fn) {
    namespace tr = decentrain::transport;
    auto options = [&](int r) {
      tr::tcp_options o;
      o.rank = r;
      o.world = n;
      o.join_timeout = std::chrono::milliseconds(20000);
      o.recv_timeout = std::chrono::milliseconds(20000);
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
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
};

}  // namespace harness

#define TRANSPORTS harness::in_process, harness::tcp
