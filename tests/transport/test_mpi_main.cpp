// The conformance suite over MPI: this program runs under `mpirun -np 8`, and each test case
// uses the first N ranks as its peers (transport_harness.hpp, harness::mpi). Catch2 itself comes
// from tests/support/catch_session.cpp.
#include "support/catch_session.hpp"

#include <decentrain/transport/mpi.hpp>

int main(int argc, char** argv) {
  decentrain::transport::mpi_environment env(&argc, &argv);
  return decentrain_test::run_catch(argc, argv);
}
