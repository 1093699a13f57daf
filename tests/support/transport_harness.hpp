// Runs one function on N peers of a given transport, each peer on its own thread, so the same
// conformance tests can be instantiated for every transport (TEMPLATE_TEST_CASE).
#pragma once

#include <decentrain/transport/in_process.hpp>

#include <functional>
#include <string>

#ifndef TRANSPORT_EXTRA
#define TRANSPORT_EXTRA
#endif

namespace harness {

struct in_process {
  static constexpr const char* name = "in_process";
  template <class Fn>
  static void run(int n, Fn fn) {
    decentrain::transport::in_process net(decentrain::transport::links::lan(n), {7, std::chrono::milliseconds(20000)});
    net.run([&](decentrain::transport::in_process::endpoint& ep) { fn(ep); });
  }
};

}  // namespace harness
