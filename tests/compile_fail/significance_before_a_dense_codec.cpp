// Must NOT compile: Gaia's significance filter in front of a dense codec, which would still send
// every zero the filter leaves.
#include <decentrain/compress/blockwise.hpp>
#include <decentrain/compress/significance.hpp>

namespace dt = decentrain;
using Wrong = dt::compress::significance<dt::compress::int8_blockwise>;
static_assert(sizeof(Wrong) > 0);
int main() {}
