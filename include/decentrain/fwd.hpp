// Forward declarations of the main types with their defaults, for headers that only name them.
#pragma once

namespace decentrain {
struct cpu;
struct cuda;
struct bf16;
class shape;
class rng;
class error;
template <class Device = cpu> class tensor;
template <class Device = cpu> class var;
template <class Device = cpu> class parameter_list;
}  // namespace decentrain
