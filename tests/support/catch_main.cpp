// The entry point of every test program that needs nothing before Catch2 runs.
#include "support/catch_session.hpp"

int main(int argc, char** argv) { return decentrain_test::run_catch(argc, argv); }
