// decentrain-gpt's GPU peers (--device cuda): the trainers of cli/peer.hpp on dt::cuda, one per
// communication and fault policy the program knows, compiled by nvcc. The host program makes
// their endpoints (TCP included, which nvcc cannot compile) and calls them through run_peer.
#include "peer.hpp"

#include <string>

namespace cli {

std::string check_gpus(const device_choice& d) {
  const int n = dt::cuda_rt::device_count();
  dt::detail::check(n > 0, "--device ", d.describe(),
                    ": this machine has no CUDA device (no GPU, or no driver; nvidia-smi shows what the driver sees)");
  dt::detail::check(d.index < n, "--device ", d.describe(), ": this machine has ", n, " CUDA device", n == 1 ? "" : "s",
                    " (cuda:0", n > 1 ? dt::detail::concat(" to cuda:", n - 1) : std::string(), ")");
  if (d.index >= 0) return dt::detail::concat("cuda:", d.index, " (", dt::cuda_rt::device_name(d.index), ")");
  std::string out = dt::detail::concat(n, " GPU", n == 1 ? "" : "s", ", peer r on cuda:r % ", n, ":");
  for (int i = 0; i < n; ++i) out += dt::detail::concat(i ? "," : "", " cuda:", i, " (", dt::cuda_rt::device_name(i), ")");
  return out;
}

void use_gpu(const device_choice& d, int rank) {
  dt::cuda_rt::set_device(d.index >= 0 ? d.index : rank % dt::cuda_rt::device_count());
}

#define DECENTRAIN_CLI_DEFINE_GPU_PEER(Comm, Fault) \
  template dt::train::fit_result run_peer<dt::cuda>(const peer_job<Comm, Fault>&, dt::transport::any_endpoint);
DECENTRAIN_CLI_GPU_PEERS(DECENTRAIN_CLI_DEFINE_GPU_PEER)
#undef DECENTRAIN_CLI_DEFINE_GPU_PEER

}  // namespace cli
