// Must NOT compile: the parallel policy given where the communication policy goes.
#include <decentrain/train/trainer.hpp>
#include <decentrain/comm/sync_allreduce.hpp>
#include <decentrain/nn/gpt.hpp>
#include <decentrain/parallel/data.hpp>

namespace dt = decentrain;
using Wrong = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::parallel::data, dt::comm::sync_allreduce<>>;
static_assert(sizeof(Wrong) > 0);
int main() {}
