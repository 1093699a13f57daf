// Catch2's implementation, compiled once for every test program (it takes about 20 s): each
// program links this object and has a main of its own (catch_main.cpp, or one that first checks
// for a GPU or starts MPI) that calls run_catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.hpp"

int decentrain_test::run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
