// Benchmarks that run as several processes of this machine: start them and wait (killing the
// rest when one fails or time runs out), and join a TCP world over loopback.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/tcp.hpp"  // defines DECENTRAIN_HAS_ASIO

namespace bench {

namespace dt = decentrain;

// Starts every command, waits for all; if one fails or time runs out, the rest are killed.
inline void run_all(const std::vector<std::vector<std::string>>& commands, std::chrono::seconds limit, const std::string& name) {
  std::vector<pid_t> pids;
  for (const auto& cmd : commands) {
    std::vector<char*> args;
    for (const auto& a : cmd) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t pid = ::fork();
    dt::detail::check(pid >= 0, "fork failed");
    if (pid == 0) {
      ::execvp(args[0], args.data());
      std::perror(args[0]);
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::string failure;
  std::size_t running = pids.size();
  while (running > 0 && failure.empty()) {
    for (auto& pid : pids) {
      if (pid <= 0) continue;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failure = name + ": a process failed (status " + std::to_string(status) + ")";
        pid = 0;
        --running;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) failure = name + ": did not finish within " + std::to_string(limit.count()) + " s";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto pid : pids)
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  dt::detail::check(failure.empty(), failure);
}

#if DECENTRAIN_HAS_ASIO
// Rank 0 publishes the port it was given in `address_file`; the others join through it.
// `configure` may change the other options (timeouts, heartbeats).
inline std::unique_ptr<dt::transport::tcp> loopback_peer(int rank, int world, const std::string& address_file,
                                                         const std::function<void(dt::transport::tcp_options&)>& configure = {}) {
  namespace fs = std::filesystem;
  dt::transport::tcp_options o;
  o.rank = rank;
  o.world = world;
  if (configure) configure(o);
  if (rank > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!fs::exists(address_file)) {
      dt::detail::check(std::chrono::steady_clock::now() < deadline, "rank 0 never published its address");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream in(address_file);
    o.join.emplace_back();
    std::getline(in, o.join.back());
  }
  auto peer = std::make_unique<dt::transport::tcp>(o);
  if (rank == 0) {
    std::ofstream(address_file + ".tmp") << peer->address() << '\n';
    fs::rename(address_file + ".tmp", address_file);
  }
  peer->connect();
  return peer;
}
#endif

}  // namespace bench
