// The conformance suite over MPI: this program runs under `mpirun -np 8`, and each test case
// uses the first N ranks as its peers (transport_harness.hpp, harness::mpi).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <decentrain/transport/mpi.hpp>

int main(int argc, char** argv) {
  decentrain::transport::mpi_environment env(&argc, &argv);
  return Catch::Session().run(argc, argv);
}
