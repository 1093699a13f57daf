// Must NOT compile: each case leaves out (or mistypes) one member of one slot, and the compiler
// must print the library's sentence for that member in that case's errors. The cases are
// instantiated in one compilation, each through instantiate<case>(); check_cases.py tells whose
// error is whose from the case each error's instantiation names, and tests/CMakeLists.txt lists
// the sentences. `none`, the positive control, leaves out nothing: no error may be its. A member
// left out is one whose requires-clause is false: to the library's checks it is not there.
#include <decentrain/train/trainer.hpp>

namespace dt = decentrain;

enum class leave_out {
  none,
  MODEL_NO_CONFIG, MODEL_NO_CTOR, MODEL_NO_PARAMETERS,
  COMM_NO_START, COMM_NO_AFTER_BACKWARD, COMM_BAD_AFTER_STEP, COMM_NO_SAVE, COMM_NO_LOAD,
  PARALLEL_NO_TAG, PARALLEL_NO_PLACE, PARALLEL_BAD_FORWARD_BACKWARD, PARALLEL_NO_EVALUATE,
  FAULT_NO_TAG, FAULT_NO_START, FAULT_NO_AFTER_STEP, FAULT_BAD_ON_ERROR,
  CODEC_NO_MAX, CODEC_NO_ENCODE, CODEC_NO_DECODE,
};

struct model_config {};
template <leave_out L> struct config_of { using config_type = model_config; };
template <> struct config_of<leave_out::MODEL_NO_CONFIG> { using config_type_typo = model_config; };

template <leave_out L>
struct model : config_of<L> {
  model(const model_config&, dt::rng&) requires(L != leave_out::MODEL_NO_CTOR) {}
  dt::parameter_list<dt::cpu>& parameters() requires(L != leave_out::MODEL_NO_PARAMETERS) { return p; }
  dt::parameter_list<dt::cpu> p;
};

template <leave_out L>
struct comm_policy {
  using policy_concept = dt::comm::policy_tag;
  template <class Ctx> void start(Ctx&) requires(L != leave_out::COMM_NO_START) {}
  template <class Ctx> void after_backward(Ctx&) requires(L != leave_out::COMM_NO_AFTER_BACKWARD) {}
  template <class Ctx> void after_step(Ctx&) requires(L != leave_out::COMM_BAD_AFTER_STEP) {}
  void after_step(int) requires(L == leave_out::COMM_BAD_AFTER_STEP) {}  // the wrong signature reads as a missing hook
  void save(dt::io::checkpoint&) const requires(L != leave_out::COMM_NO_SAVE) {}
  void load(const dt::io::checkpoint&) requires(L != leave_out::COMM_NO_LOAD) {}
};

template <leave_out L> struct parallel_tag { using policy_concept = dt::parallel::policy_tag; };
template <> struct parallel_tag<leave_out::PARALLEL_NO_TAG> {};
template <leave_out L>
struct parallel_policy : parallel_tag<L> {
  dt::parallel::placement place(int, int world) const requires(L != leave_out::PARALLEL_NO_PLACE) {
    return dt::parallel::everyone(world);
  }
  template <class Ctx> dt::parallel::step_result forward_backward(Ctx&) requires(L != leave_out::PARALLEL_BAD_FORWARD_BACKWARD) {
    return {};
  }
  template <class Ctx> double forward_backward(Ctx&) requires(L == leave_out::PARALLEL_BAD_FORWARD_BACKWARD) { return 0; }
  template <class Ctx> double evaluate(Ctx&, std::int64_t) requires(L != leave_out::PARALLEL_NO_EVALUATE) { return 0; }
};

template <leave_out L> struct fault_tag { using policy_concept = dt::fault::policy_tag; };
template <> struct fault_tag<leave_out::FAULT_NO_TAG> {};
template <leave_out L>
struct fault_policy : fault_tag<L> {
  template <class Ctx> void start(Ctx&) requires(L != leave_out::FAULT_NO_START) {}
  template <class Ctx> void after_step(Ctx&) requires(L != leave_out::FAULT_NO_AFTER_STEP) {}
  template <class Ctx> dt::fault::action on_error(Ctx&, const dt::transport::peer_error&) requires(L != leave_out::FAULT_BAD_ON_ERROR) {
    return dt::fault::action::rethrow;
  }
  template <class Ctx> bool on_error(Ctx&, const dt::transport::peer_error&) requires(L == leave_out::FAULT_BAD_ON_ERROR) {
    return false;
  }
};

template <leave_out L>
struct codec {
  std::size_t max_encoded_bytes(std::size_t n) const requires(L != leave_out::CODEC_NO_MAX) { return n; }
  std::size_t encode(std::span<const float>, std::span<std::byte>) requires(L != leave_out::CODEC_NO_ENCODE) { return 0; }
  void decode_add(std::span<const std::byte>, std::span<float>) const requires(L != leave_out::CODEC_NO_DECODE) {}
};

// One case: the codec's through a policy that takes one, the others' through the trainer.
template <leave_out L>
constexpr bool instantiate() {
  if constexpr (L == leave_out::CODEC_NO_MAX || L == leave_out::CODEC_NO_ENCODE || L == leave_out::CODEC_NO_DECODE)
    return sizeof(dt::comm::sync_allreduce<codec<L>>) > 0;
  else
    return sizeof(dt::train::trainer<model<L>, comm_policy<L>, parallel_policy<L>, fault_policy<L>>) > 0;
}
static_assert(instantiate<leave_out::none>());
static_assert(instantiate<leave_out::MODEL_NO_CONFIG>());
static_assert(instantiate<leave_out::MODEL_NO_CTOR>());
static_assert(instantiate<leave_out::MODEL_NO_PARAMETERS>());
static_assert(instantiate<leave_out::COMM_NO_START>());
static_assert(instantiate<leave_out::COMM_NO_AFTER_BACKWARD>());
static_assert(instantiate<leave_out::COMM_BAD_AFTER_STEP>());
static_assert(instantiate<leave_out::COMM_NO_SAVE>());
static_assert(instantiate<leave_out::COMM_NO_LOAD>());
static_assert(instantiate<leave_out::PARALLEL_NO_TAG>());
static_assert(instantiate<leave_out::PARALLEL_NO_PLACE>());
static_assert(instantiate<leave_out::PARALLEL_BAD_FORWARD_BACKWARD>());
static_assert(instantiate<leave_out::PARALLEL_NO_EVALUATE>());
static_assert(instantiate<leave_out::FAULT_NO_TAG>());
static_assert(instantiate<leave_out::FAULT_NO_START>());
static_assert(instantiate<leave_out::FAULT_NO_AFTER_STEP>());
static_assert(instantiate<leave_out::FAULT_BAD_ON_ERROR>());
static_assert(instantiate<leave_out::CODEC_NO_MAX>());
static_assert(instantiate<leave_out::CODEC_NO_ENCODE>());
static_assert(instantiate<leave_out::CODEC_NO_DECODE>());

int main() {}
