// Runs Catch2 on a test program's command line (support/catch_session.cpp): Catch::Session is
// declared only where Catch2's implementation is compiled.
#pragma once

namespace decentrain_test {
int run_catch(int argc, char** argv);
}
