// Where received messages wait until a recv asks for them: one FIFO per (source, tag), a
// condition variable, a timeout, and a way to fail every waiter when a peer or the network is
// gone (so a peer blocked on a dead neighbour gets an error instead of hanging).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "decentrain/detail/error.hpp"
#include "decentrain/transport/endpoint.hpp"

namespace decentrain::transport::detail {

struct message {
  bytes payload;
  double arrival = 0.0;  // simulated arrival time (in_process); 0 elsewhere
};

class mailbox {
 public:
  void push(int source, tag_type tag, message m) {
    {
      std::lock_guard lock(mutex_);
      queues_[{source, tag}].push_back(std::move(m));
    }
    ready_.notify_all();
  }

  // The next message from `source` with `tag`; throws when `timeout` passes first, when
  // `source` was closed, or when the whole mailbox was failed.
  message pop(int source, tag_type tag, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    const auto key = std::pair{source, tag};
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto it = queues_.find(key);
      if (it != queues_.end() && !it->second.empty()) {
        message m = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
        return m;
      }
      if (!failure_.empty()) decentrain::detail::fail(failure_);
      if (auto c = closed_.find(source); c != closed_.end())
        decentrain::detail::fail("transport: peer ", source, " is gone (", c->second, ")");
      if (ready_.wait_until(lock, deadline) == std::cv_status::timeout) {
        auto again = queues_.find(key);
        if (again == queues_.end() || again->second.empty())
          decentrain::detail::fail("transport: no message from peer ", source, " (tag ", tag, ") within ",
                                   timeout.count(), " ms: the peer is slow, partitioned or has failed");
      }
    }
  }

  // Messages already queued from `source` stay readable; waits for more fail with `reason`.
  void close(int source, std::string reason) {
    {
      std::lock_guard lock(mutex_);
      closed_.emplace(source, std::move(reason));
    }
    ready_.notify_all();
  }
  void reopen(int source) {
    std::lock_guard lock(mutex_);
    closed_.erase(source);
  }

  void fail_all(std::string reason) {
    {
      std::lock_guard lock(mutex_);
      if (failure_.empty()) failure_ = std::move(reason);
    }
    ready_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::map<std::pair<int, tag_type>, std::deque<message>> queues_;
  std::map<int, std::string> closed_;
  std::string failure_;
};

}  // namespace decentrain::transport::detail
