// Small template helpers shared by the policy and dispatch code.
#pragma once

#include <type_traits>

namespace decentrain::detail {

// Lets a primary template's body be a static_assert that fires only when instantiated.
template <class...>
inline constexpr bool dependent_false = false;

template <class T, class... Ts>
inline constexpr bool is_one_of = (std::is_same_v<T, Ts> || ...);

// A policy opts into a policy kind by naming the kind's tag: `using policy_concept = Tag;`.
template <class P, class Tag>
concept opts_into = requires { typename P::policy_concept; } && std::is_same_v<typename P::policy_concept, Tag>;

}  // namespace decentrain::detail
