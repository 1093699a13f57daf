// Every transport: the endpoint concept, simulated in-process peers, TCP (when standalone asio
// is available), MPI (when the build defines DECENTRAIN_HAS_MPI, as the decentrain::mpi
// CMake target does) and NCCL (DECENTRAIN_HAS_NCCL, as decentrain::nccl does).
#pragma once

#include "decentrain/transport/any_endpoint.hpp"
#include "decentrain/transport/endpoint.hpp"
#include "decentrain/transport/frame.hpp"
#include "decentrain/transport/in_process.hpp"
#include "decentrain/transport/mpi.hpp"
#include "decentrain/transport/nccl.hpp"
#include "decentrain/transport/tcp.hpp"
