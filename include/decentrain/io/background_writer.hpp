// One job at a time on a thread of its own: a checkpoint is encoded and written to disk while
// training goes on. submit() first waits for the job before it (memory stays bounded however
// slow the disk) and rethrows that job's error: a failed write stops the run at the next save
// instead of being lost.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace decentrain::io {

class background_writer {
 public:
  background_writer() : thread_([this] { run(); }) {}
  background_writer(const background_writer&) = delete;
  background_writer& operator=(const background_writer&) = delete;
  // Finishes the job in flight (a write is never cut short); its error, if any, goes unreported:
  // call wait() first where it matters.
  ~background_writer() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void submit(std::function<void()> job) {
    {
      std::unique_lock lock(mutex_);
      idle_.wait(lock, [&] { return !busy_; });
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      job_ = std::move(job);
      busy_ = true;
    }
    wake_.notify_all();
  }

  // Returns once no job runs; rethrows the error of the last one, once.
  void wait() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  bool busy() const {
    std::lock_guard lock(mutex_);
    return busy_;
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return busy_ || stopping_; });
      if (!busy_) return;
      auto job = std::exchange(job_, nullptr);
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      busy_ = false;
      idle_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::function<void()> job_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members it reads exist
};

}  // namespace decentrain::io
