// Must NOT compile, once per case: each case leaves out (or mistypes) one member of one slot,
// and the test passes only when the compiler prints the library's sentence for that member.
// The case is chosen with -DCASE_<NAME>.
#include <decentrain/train/trainer.hpp>

namespace dt = decentrain;

struct model_config {};
struct model {
#ifndef CASE_MODEL_NO_CONFIG
  using config_type = model_config;
#else
  using config_type_typo = model_config;
#endif
#ifndef CASE_MODEL_NO_CTOR
  model(const model_config&, dt::rng&) {}
#endif
#ifndef CASE_MODEL_NO_PARAMETERS
  dt::parameter_list<dt::cpu>& parameters() { return p; }
#endif
  dt::parameter_list<dt::cpu> p;
};

struct comm_policy {
  using policy_concept = dt::comm::policy_tag;
#ifndef CASE_COMM_NO_START
  template <class Ctx> void start(Ctx&) {}
#endif
#ifndef CASE_COMM_NO_AFTER_BACKWARD
  template <class Ctx> void after_backward(Ctx&) {}
#endif
#ifndef CASE_COMM_BAD_AFTER_STEP
  template <class Ctx> void after_step(Ctx&) {}
#else
  void after_step(int) {}  // the wrong signature reads the same as a missing hook
#endif
#ifndef CASE_COMM_NO_SAVE
  void save(dt::io::checkpoint&) const {}
#endif
#ifndef CASE_COMM_NO_LOAD
  void load(const dt::io::checkpoint&) {}
#endif
};

struct parallel_policy {
#ifndef CASE_PARALLEL_NO_TAG
  using policy_concept = dt::parallel::policy_tag;
#endif
#ifndef CASE_PARALLEL_NO_PLACE
  dt::parallel::placement place(int, int world) const { return dt::parallel::everyone(world); }
#endif
#ifndef CASE_PARALLEL_BAD_FORWARD_BACKWARD
  template <class Ctx> dt::parallel::step_result forward_backward(Ctx&) { return {}; }
#else
  template <class Ctx> double forward_backward(Ctx&) { return 0; }
#endif
#ifndef CASE_PARALLEL_NO_EVALUATE
  template <class Ctx> double evaluate(Ctx&, std::int64_t) { return 0; }
#endif
};

struct fault_policy {
#ifndef CASE_FAULT_NO_TAG
  using policy_concept = dt::fault::policy_tag;
#endif
#ifndef CASE_FAULT_NO_START
  template <class Ctx> void start(Ctx&) {}
#endif
#ifndef CASE_FAULT_NO_AFTER_STEP
  template <class Ctx> void after_step(Ctx&) {}
#endif
#ifndef CASE_FAULT_BAD_ON_ERROR
  template <class Ctx> dt::fault::action on_error(Ctx&, const dt::transport::peer_error&) { return dt::fault::action::rethrow; }
#else
  template <class Ctx> bool on_error(Ctx&, const dt::transport::peer_error&) { return false; }
#endif
};

struct codec {
#ifndef CASE_CODEC_NO_MAX
  std::size_t max_encoded_bytes(std::size_t n) const { return n; }
#endif
#ifndef CASE_CODEC_NO_ENCODE
  std::size_t encode(std::span<const float>, std::span<std::byte>) { return 0; }
#endif
#ifndef CASE_CODEC_NO_DECODE
  void decode_add(std::span<const std::byte>, std::span<float>) const {}
#endif
};

#if defined(CASE_CODEC_NO_MAX) || defined(CASE_CODEC_NO_ENCODE) || defined(CASE_CODEC_NO_DECODE)
using Wrong = dt::comm::sync_allreduce<codec>;
#else
using Wrong = dt::train::trainer<model, comm_policy, parallel_policy, fault_policy>;
#endif
static_assert(sizeof(Wrong) > 0);
int main() {}
