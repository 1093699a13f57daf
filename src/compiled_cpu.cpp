// The decentrain::compiled library: the CPU instantiations that headers declare `extern template`
// when DECENTRAIN_COMPILED_LIB is defined (see config.hpp), compiled once here. A program linked
// with it (CMake: target_link_libraries(app decentrain::compiled)) compiles its own policies and
// the trainer, and takes these from here. Each line below has its `extern template` beside the
// template it instantiates; a declaration without a line here fails the consumer's link.
#include "decentrain/collective/communicator.hpp"
#include "decentrain/nn/gpt.hpp"
#include "decentrain/optim/adamw.hpp"
#include "decentrain/optim/clip.hpp"

namespace decentrain {

template class nn::gpt<cpu>;
template class optim::adamw<cpu>;
template double optim::clip_grad_norm<cpu>(parameter_list<cpu>&, double);

template class collective::communicator<transport::any_endpoint>;
#define DECENTRAIN_ALL_REDUCE(T)                                                                                      \
  template void collective::communicator<transport::any_endpoint>::ring_all_reduce<T>(std::span<T>, collective::reduce_op, \
                                                                                      transport::tag_type);            \
  template void collective::communicator<transport::any_endpoint>::recursive_doubling_all_reduce<T>(                    \
      std::span<T>, collective::reduce_op, transport::tag_type);                                                       \
  template void collective::communicator<transport::any_endpoint>::halving_doubling_all_reduce<T>(                      \
      std::span<T>, collective::reduce_op, transport::tag_type);
DECENTRAIN_REDUCIBLE_TYPES(DECENTRAIN_ALL_REDUCE)
#undef DECENTRAIN_ALL_REDUCE

}  // namespace decentrain
