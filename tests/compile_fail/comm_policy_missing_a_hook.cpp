// Must NOT compile: a communication policy that opts in but lacks after_step.
#include <decentrain/train/trainer.hpp>
#include <decentrain/nn/gpt.hpp>

namespace dt = decentrain;
struct half_policy {
  using policy_concept = dt::comm::policy_tag;
  template <class Ctx> void start(Ctx&) {}
  template <class Ctx> void after_backward(Ctx&) {}
  void save(dt::io::checkpoint&) const {}
  void load(const dt::io::checkpoint&) {}
};
using Wrong = dt::train::trainer<dt::nn::gpt<dt::cpu>, half_policy>;
static_assert(sizeof(Wrong) > 0);
int main() {}
