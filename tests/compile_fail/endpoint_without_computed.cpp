// Must NOT compile: a transport endpoint missing one function of the concept.
#include <decentrain/transport/any_endpoint.hpp>

namespace dt = decentrain;
struct partial_endpoint {
  int rank() const { return 0; }
  int world() const { return 1; }
  void send(int, dt::transport::tag_type, std::span<const std::byte>) {}
  dt::transport::bytes recv(int, dt::transport::tag_type) { return {}; }
  dt::transport::received recv_any(std::span<const int>, dt::transport::tag_type) { return {}; }
  std::optional<dt::transport::bytes> try_recv(int, dt::transport::tag_type) { return {}; }
  dt::transport::traffic_stats stats() const { return {}; }
};
int main() {
  dt::transport::any_endpoint e{partial_endpoint{}};
  return e.rank();
}
