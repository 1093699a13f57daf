// Must NOT compile: an asynchronous communication policy (its peers at different steps) under a
// fault policy that re-forms the group at a step every member shares.
#include <decentrain/train/trainer.hpp>
#include <decentrain/comm/ad_psgd.hpp>
#include <decentrain/fault/elastic.hpp>
#include <decentrain/nn/gpt.hpp>
#include <decentrain/parallel/data.hpp>

namespace dt = decentrain;
using Wrong = dt::train::trainer<dt::nn::gpt<dt::cpu>, dt::comm::ad_psgd<>, dt::parallel::data, dt::fault::elastic>;
static_assert(sizeof(Wrong) > 0);
int main() {}
