// Weight gradients put off. Zero-bubble pipeline schedules split a stage's backward in two: the
// input gradient, which the stage before waits for, and the weight gradients, which nobody
// waits for and which run later, in time the stage would otherwise spend waiting (Qi et al.
// 2023; their WeightGradStore does this for Megatron's linear layers). While a
// `defer_weight_gradients` scope is alive on a thread, the linear layers' backward passes
// compute their input gradient and queue the weight and bias gradients (dW = x^T dY, db = sum
// dY) in the scope's `weight_gradients`, keeping x and dY alive until then; `run()` computes
// them later and adds them to the parameters' gradients (a parameter's own, also where the layer
// multiplies a cast copy of it), with the same products as at once.
// The other parameters' gradients (layer norms, embeddings, a fused loss's weight) are small or
// made in the forward pass, and are made at once.
#pragma once

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace decentrain {

class weight_gradients {
 public:
  void defer(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Runs what was queued, in the order it was queued, and forgets it (all of it, also when one
  // throws: what came after it is lost, and the step must be computed again). Work still queued
  // when the queue is destroyed is lost as well: its gradients are never added.
  void run() {
    auto work = std::move(work_);
    work_.clear();
    for (auto& w : work) w();
  }
  bool empty() const { return work_.empty(); }
  std::size_t size() const { return work_.size(); }

 private:
  std::vector<std::function<void()>> work_;
};

namespace detail {
// Where this thread's ops queue weight gradients; null: they compute them at once.
inline weight_gradients*& deferred_weight_gradients() {
  thread_local weight_gradients* queue = nullptr;
  return queue;
}
}  // namespace detail

// While alive, backward passes on this thread queue their linear layers' weight gradients in `to`.
class defer_weight_gradients {
 public:
  explicit defer_weight_gradients(weight_gradients& to) : previous_(detail::deferred_weight_gradients()) {
    detail::deferred_weight_gradients() = &to;
  }
  ~defer_weight_gradients() { detail::deferred_weight_gradients() = previous_; }
  defer_weight_gradients(const defer_weight_gradients&) = delete;
  defer_weight_gradients& operator=(const defer_weight_gradients&) = delete;

 private:
  weight_gradients* previous_;
};

}  // namespace decentrain
