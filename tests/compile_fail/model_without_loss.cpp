// Must NOT compile: a model type the trainer cannot train (no loss()).
#include <decentrain/train/trainer.hpp>

namespace dt = decentrain;
struct no_loss_model {
  using config_type = int;
  no_loss_model(const int&, dt::rng&) {}
  dt::parameter_list<dt::cpu>& parameters() { return params; }
  dt::parameter_list<dt::cpu> params;
};
using Wrong = dt::train::trainer<no_loss_model>;
static_assert(sizeof(Wrong) > 0);
int main() {}
